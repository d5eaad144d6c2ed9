"""Make ``sailrl/tiny-tools``: ``sailrl/tiny-arith`` taught to call the calculator tool about half the time.

Every training text is an episode rendered by sailrl's real episode path: an
:class:`~sailrl.runtime.rollouts.episode.EpisodeGroupBuilder` with the built-in calculator (the ``role_colon_tools``
renderer declares it in a ``System:`` turn in front of ``User: 3+4=``), played by a scripted sampling client
through tinker_cookbook's ``do_group_rollout``, and turned into tokens and a loss mask by the cookbook's
``assemble_training_data`` -- the datum RL trains on. Two kinds of episode, drawn half and half
(``--tool-fraction``) by ``random.Random(--seed)``:

- **direct**: the reply is an answer sampled (temperature 1, seeded) from ``sailrl/tiny-arith`` on the
  quickstart's plain prompt ``User: 3+4=\\n\\nAssistant:``; only replies that end with the stop text are kept.
  So the direct answers are as good as tiny-arith's: right about a third of the time (``direct_pool_correct``);
- **tool**: the reply is ``<tool_call>{"name": "calculator", "arguments": {"expression": "3+4"}}</tool_call>``,
  the calculator's result comes back as the ``<tool_response>`` turn, and the second reply copies it (`` 7``).

Training: full-parameter from tiny-arith's shipped weights, the loss on the model's own tokens only (the mask:
prompt and tool result weight 0), ``torch.optim.AdamW`` (lr ``--lr``, betas 0.9/0.95, no weight decay),
``--batch-size`` episodes per step, one torch thread. The prefix every episode shares (the tool declaration and
``User: ``) is run once per step without gradient and its keys and values shared by the batch (the loss is the
same as a full pass's; the gradient does not flow into the prefix's positions). ``--practice-fraction`` mixes in
tool episodes on two-digit sums (tried as copying practice; it learnt slower in its first 100 steps, default
off). Prints per ``--log-every`` steps the teacher-forced
measures over the 100 questions (deterministic; computed by :func:`measure`):

- ``p(call)``: probability that the first reply is the exact tool call for its question (stop text included);
- ``p(copy)``: probability that the reply after the tool result is the result (stop text included);
- ``p(direct ok)``: probability that the first reply is the right answer directly;
- ``expected correct``: ``p(call) * p(copy) + p(direct ok)`` (a lower bound on one sampled episode's
  ``correct``: a wrong call or answer form that still scores is not counted).

::

    python runtime/backends/local/pretrained/make_tiny_tools.py --steps 1700   # rewrites tiny_tools.safetensors next to it

The shipped file: ``--steps 1700 --lr 3e-3 --batch-size 16 --seed 0`` (taken with ``--save-every`` from a
3000-step run; the measures swing by about 0.1 between checkpoints 100 steps apart). Measured then: p(call)
0.439, p(copy) 0.997, p(direct ok) 0.144, expected correct 0.581; about 0.2 s of CPU a step (one thread), so
1700 steps are 6 CPU-minutes. The same settings with the cookbook-style 600-token declaration learnt slower
(p(call) 0.07 vs 0.25 and p(copy) 0.30 vs 0.42 at step 400), which is why role_colon_tools declares tools short.

The weights are written as float32 safetensors with the settings and the final measures in the file's
metadata. Deterministic for given arguments on one torch version and CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import random
from pathlib import Path
from types import SimpleNamespace

import tinker
import torch
from tinker_cookbook.renderers.base import ToolCall
from tinker_cookbook.rl.data_processing import assemble_training_data
from tinker_cookbook.rl.rollouts import do_group_rollout

from sailrl.runtime.backends.local.engine.generation import SampleRequest, generate
from sailrl.runtime.backends.local.weights.tiny import load_base_model, resolve_base_model, save_pretrained_weights
from sailrl.runtime.backends.models import get_renderer, get_tokenizer
from sailrl.runtime.backends.role_colon_tools import format_tool_call
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.runtime.rollouts.episode import EpisodeGroupBuilder, build_tools
from sailrl.runtime.rollouts.rollout import SamplingPolicy
from sailrl.spec.environment import EnvironmentSpec
from sailrl.spec.rewards import RewardSpec

OUT = Path(__file__).with_name("tiny_tools.safetensors")
#: The episode the texts are made of; spec/examples/calculator.yaml runs the same one (a test checks it).
ENVIRONMENT = {"max_turns": 3, "max_tool_calls": 2, "tools": [{"builtin": "calculator"}]}
USER_TEMPLATE = "{question}="
STOP = "\n\nUser:"
#: Answers sampled from tiny-arith per question for the direct episodes.
DIRECT_SAMPLES = 16
MAX_TOKENS = 96
#: Tool episodes on two-digit sums (not in the example's data): copying practice.
PRACTICE_SUMS = 2000


def sums() -> list[tuple[str, str]]:
    """The 100 (question, answer) pairs ``("3+4", "7")``, a and b in 0..9, in order."""
    return [(f"{a}+{b}", str(a + b)) for a in range(10) for b in range(10)]


def tool_call_text(question: str) -> str:
    """The first reply of a tool episode: a calculator call in role_colon_tools' format (its own writer)."""
    call = ToolCall(function=ToolCall.FunctionBody(name="calculator", arguments=f'{{"expression": "{question}"}}'))
    return " " + format_tool_call(call)


class _Scripted:
    """A sampling client that answers each call with the next scripted reply (tokens, stop)."""

    def __init__(self, replies: list[list[int]]):
        self.replies = list(replies)

    async def sample_async(self, prompt, num_samples, sampling_params):
        toks = self.replies.pop(0)
        return SimpleNamespace(sequences=[SimpleNamespace(tokens=toks, logprobs=[0.0] * len(toks),
                                                          stop_reason="stop")])


def _parts():

    tok = get_tokenizer("sailrl/tiny")
    renderer = get_renderer("role_colon_tools", tok)
    environment = EnvironmentSpec.model_validate(ENVIRONMENT)
    reward = RewardSpec.model_validate({"rules": [
        {"name": "correct", "kind": "answer", "extract": {"from": "whole"},
         "reference": {"extract": {"from": "whole"}}, "compare": "numeric", "weight": 1.0}]})
    return tok, renderer, environment, build_tools(environment, "."), RewardFunction.from_spec(reward, "answer")


def render_episode(question: str, answer: str, replies: list[str], parts=None) -> dict:
    """Play one episode of ``question`` with the scripted ``replies`` (each ending with the stop text) through
    the real episode path; returns ``tokens``, ``weights`` (1 on the replies' tokens), ``reward`` and the
    episode's ``metrics``."""
    tok, renderer, environment, tools, reward_fn = parts or _parts()
    builder = EpisodeGroupBuilder(row={"question": question, "answer": answer},
                                  messages=[{"role": "user", "content": USER_TEMPLATE.format(question=question)}],
                                  renderer=renderer, reward_fn=reward_fn, environment=environment, tools=tools,
                                  group_size=1, max_tokens=MAX_TOKENS)
    encoded = [tok.encode(r, add_special_tokens=False) for r in replies]
    group = asyncio.run(do_group_rollout(builder, SamplingPolicy(_Scripted(encoded), max_tokens=MAX_TOKENS)))
    traj = group.trajectories_G[0]
    if len(traj.transitions) != len(replies):
        raise RuntimeError(f"episode of {question!r} took {len(traj.transitions)} turns, not {len(replies)}")
    (datum,), _ = assemble_training_data([SimpleNamespace(trajectories_G=[traj])], [[1.0]])
    tokens = datum.model_input.to_ints() + datum.loss_fn_inputs["target_tokens"].tolist()[-1:]
    weights = [0.0] + datum.loss_fn_inputs["mask"].tolist()
    last = traj.transitions[-1]
    return {"tokens": tokens, "weights": weights, "reward": last.reward, "metrics": dict(last.metrics)}


def direct_answers(seed: int, per_question: int = DIRECT_SAMPLES) -> dict[str, list[str]]:
    """Per question, the replies ``sailrl/tiny-arith`` samples (temperature 1, seeded) on the quickstart's
    prompt, keeping those that end with the stop text (the text includes it)."""
    tok = get_tokenizer("sailrl/tiny-arith")
    renderer = get_renderer("role_colon", tok)
    model = load_base_model(resolve_base_model("sailrl/tiny-arith", 0))
    params = tinker.SamplingParams(max_tokens=12, temperature=1.0, stop=[STOP])
    requests = [SampleRequest(renderer.build_generation_prompt([{"role": "user", "content": f"{q}="}]).to_ints(),
                              per_question, params) for q, _ in sums()]
    with torch.no_grad():
        out = generate(model, requests, tokenizer=tok, max_context=4096, generator=torch.Generator().manual_seed(seed))
    pool: dict[str, list[str]] = {}
    for (q, _), response in zip(sums(), out, strict=True):
        pool[q] = [tok.decode(s.tokens) for s in response.sequences if s.stop_reason == "stop"]
    return pool


def _sequence_logprob(model: torch.nn.Module, texts: list[tuple[list[int], int, int]]) -> list[float]:
    """log p(tokens[start:end] | tokens[:start]) for each (tokens, start, end), teacher-forced, batched."""
    out: list[float] = []
    with torch.no_grad():
        for i in range(0, len(texts), 20):
            chunk = texts[i:i + 20]
            width = max(len(t) for t, _, _ in chunk)
            ids = torch.zeros((len(chunk), width), dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for j, (t, _, _) in enumerate(chunk):
                ids[j, :len(t)] = torch.tensor(t)
                mask[j, :len(t)] = 1
            logprobs = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits[:, :-1].float(), dim=-1)
            picked = logprobs.gather(-1, ids[:, 1:, None]).squeeze(-1)
            for j, (_, start, end) in enumerate(chunk):
                out.append(float(picked[j, start - 1:end - 1].sum()))
    return out


def _spans(weights: list[float]) -> list[tuple[int, int]]:
    """The (start, end) index ranges where ``weights`` is 1."""
    spans, start = [], None
    for i, w in enumerate([*weights, 0.0]):
        if w and start is None:
            start = i
        elif not w and start is not None:
            spans.append((start, i))
            start = None
    return spans


def measure(model: torch.nn.Module, tool_texts: list[dict], right_texts: list[dict]) -> dict[str, float]:
    """The teacher-forced measures of the module docstring, means over the 100 questions."""
    call, copy, direct = [], [], []
    for ep in tool_texts:
        (s1, e1), (s2, e2) = _spans(ep["weights"])
        call.append((ep["tokens"], s1, e1))
        copy.append((ep["tokens"], s2, e2))
    for ep in right_texts:
        (s1, e1), = _spans(ep["weights"])
        direct.append((ep["tokens"], s1, e1))
    p_call = [float(torch.tensor(x).exp()) for x in _sequence_logprob(model, call)]
    p_copy = [float(torch.tensor(x).exp()) for x in _sequence_logprob(model, copy)]
    p_direct = [float(torch.tensor(x).exp()) for x in _sequence_logprob(model, direct)]
    n = len(p_call)
    return {"p_call": sum(p_call) / n, "p_copy": sum(p_copy) / n, "p_direct_ok": sum(p_direct) / n,
            "expected_correct": sum(a * b + c for a, b, c in zip(p_call, p_copy, p_direct, strict=True)) / n}


def measured_episodes(parts=None) -> tuple[list[dict], list[dict]]:
    """The episodes :func:`measure` reads: per question, the tool episode and the right direct answer."""
    parts = parts or _parts()
    tool = [render_episode(q, a, [tool_call_text(q) + STOP, f" {a}" + STOP], parts) for q, a in sums()]
    right = [render_episode(q, a, [f" {a}" + STOP], parts) for q, a in sums()]
    return tool, right


def practice_sums(seed: int, n: int = PRACTICE_SUMS) -> list[tuple[str, str]]:
    """``n`` sums of two numbers in 0..99 drawn by ``random.Random(seed)``, none of them single-digit."""
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    while len(out) < n:
        a, b = rng.randrange(100), rng.randrange(100)
        if a > 9 or b > 9:
            out.append((f"{a}+{b}", str(a + b)))
    return out


def episodes(seed: int, practice: bool = True) -> tuple[list[dict], dict[str, list[dict]], list[dict], float,
                                                       list[dict]]:
    """The rendered texts: the 100 tool episodes, the direct episodes per question (one per distinct sampled
    reply, repeated as often as sampled), the 100 right direct answers (for :func:`measure`), the share of
    right answers in the direct pool, and the tool episodes of :func:`practice_sums`."""
    parts = _parts()
    tool, right = measured_episodes(parts)
    practice = [render_episode(q, a, [tool_call_text(q) + STOP, f" {a}" + STOP], parts)
                for q, a in practice_sums(seed)] if practice else []
    pool = direct_answers(seed)
    cache: dict[tuple[str, str], dict] = {}
    direct: dict[str, list[dict]] = {}
    hits = total = 0
    for q, a in sums():
        direct[q] = []
        for reply in pool[q]:
            if (q, reply) not in cache:
                cache[(q, reply)] = render_episode(q, a, [reply], parts)
            ep = cache[(q, reply)]
            direct[q].append(ep)
            hits += ep["reward"] == 1.0
            total += 1
    return tool, direct, right, hits / max(total, 1), practice


def _common_prefix(texts: list[list[int]]) -> list[int]:
    """The longest token prefix every text shares (the tool declaration and ``User: ``)."""
    first = texts[0]
    n = min(len(t) for t in texts)
    for t in texts[1:]:
        while n and t[:n] != first[:n]:
            n -= 1
    return first[:n]


def _weight(batch: list[dict]) -> float:
    return float(sum(sum(ep["weights"]) for ep in batch))


def _batch_loss(model: torch.nn.Module, batch: list[dict], prefix: list[int]) -> torch.Tensor:
    """Mean next-token loss over the weighted tokens of ``batch``. Every text starts with ``prefix`` (weight 0):
    its keys and values are computed once, without gradient, and shared by the batch -- the prefix (600 tokens
    of tool declaration) is most of each text, so this makes a step about 5x cheaper; the suffixes' forward pass
    is the same as a full one."""
    n = len(prefix)
    with torch.no_grad():
        cache = model(input_ids=torch.tensor([prefix]), use_cache=True).past_key_values
    cache.batch_repeat_interleave(len(batch))
    width = max(len(ep["tokens"]) for ep in batch) - n
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    weight = torch.zeros((len(batch), width))
    for i, ep in enumerate(batch):
        m = len(ep["tokens"]) - n
        ids[i, :m] = torch.tensor(ep["tokens"][n:])
        mask[i, :m] = 1
        weight[i, :m] = torch.tensor(ep["weights"][n:])
    full_mask = torch.cat([torch.ones((len(batch), n), dtype=torch.long), mask], dim=1)
    positions = torch.arange(n, n + width)[None].expand(len(batch), -1)
    logits = model(input_ids=ids, attention_mask=full_mask, position_ids=positions, past_key_values=cache).logits
    logits, targets, w = logits[:, :-1], ids[:, 1:], weight[:, 1:]
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                            reduction="none").view_as(w)
    return (nll * w).sum() / w.sum()


def train(steps: int, lr: float, batch_size: int, seed: int, tool_fraction: float = 0.5,
          practice_fraction: float = 0.0, log_every: int = 25, save_every: int = 0,
          out: Path | None = None, measures: bool = True) -> tuple[torch.nn.Module, dict[str, float]]:
    """Pretrain and return (model in eval mode, final measures + ``direct_pool_correct``; without ``measures``, only
    ``direct_pool_correct``: the measures are a teacher-forced function of the weights)."""

    torch.set_num_threads(1)
    tool, direct, right, pool_correct, practice = episodes(seed, practice=practice_fraction > 0)
    questions = [q for q, _ in sums() if direct[q]]
    prefix = _common_prefix([ep["tokens"] for ep in tool + right])
    model = load_base_model(resolve_base_model("sailrl/tiny-arith", 0))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    rng = random.Random(seed)
    print(f"direct replies sampled from tiny-arith: {sum(len(v) for v in direct.values())}, "
          f"right {pool_correct:.3f}")
    for step in range(steps):
        batch = []
        for _ in range(batch_size):
            if rng.random() < practice_fraction:
                batch.append(practice[rng.randrange(len(practice))])
            elif rng.random() < tool_fraction:
                batch.append(tool[rng.randrange(len(tool))])
            else:
                q = questions[rng.randrange(len(questions))]
                batch.append(direct[q][rng.randrange(len(direct[q]))])
        # tool episodes (~160 tokens after the prefix) and direct ones (~15) in two passes, not padded together
        parts = [[ep for ep in batch if len(ep["tokens"]) - len(prefix) > 40],
                 [ep for ep in batch if len(ep["tokens"]) - len(prefix) <= 40]]
        loss = sum(_batch_loss(model, part, prefix) * _weight(part) for part in parts if part) / _weight(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if save_every and out is not None and (step + 1) % save_every == 0 and step + 1 < steps:
            save_pretrained_weights(model, out.with_suffix(f".step{step + 1}.safetensors"), {"steps": str(step + 1)})
        if measures and ((step + 1) % log_every == 0 or step + 1 == steps):
            model.eval()
            m = measure(model, tool, right)
            model.train()
            print(f"step {step + 1:4d}  loss {loss.item():.4f}  p(call) {m['p_call']:.3f}  p(copy) {m['p_copy']:.3f}"
                  f"  p(direct ok) {m['p_direct_ok']:.3f}  expected correct {m['expected_correct']:.3f}", flush=True)
    model.eval()
    return model, {**(measure(model, tool, right) if measures else {}), "direct_pool_correct": pool_correct}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1700)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tool-fraction", type=float, default=0.5)
    parser.add_argument("--practice-fraction", type=float, default=0.0)
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--save-every", type=int, default=0, help="also write the weights every N steps "
                        "(OUT with .stepN before the suffix; the same weights a --steps N run writes)")
    args = parser.parse_args(argv)

    model, m = train(args.steps, args.lr, args.batch_size, args.seed, args.tool_fraction,
                     args.practice_fraction, args.log_every, args.save_every, args.out)
    meta = {"steps": str(args.steps), "lr": str(args.lr), "batch_size": str(args.batch_size), "seed": str(args.seed),
            "tool_fraction": str(args.tool_fraction), "practice_fraction": str(args.practice_fraction),
            "torch": torch.__version__,
            **{k: f"{v:.4f}" for k, v in m.items()}}
    save_pretrained_weights(model, args.out, meta)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB), " +
          ", ".join(f"{k} {v:.3f}" for k, v in m.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
