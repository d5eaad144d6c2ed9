"""Make ``sailrl/tiny-arith``: ``sailrl/tiny``'s architecture pretrained on single-digit sums, stopped early.

The text is every sum ``a + b`` with 0 <= a, b <= 9, rendered as the quickstart renders it (role_colon:
``"User: 3+4=\\n\\nAssistant: 7\\n\\nUser:"``, byte tokens). Training: full-parameter, every token of the text
weighted (next-token prediction), ``torch.optim.AdamW`` (lr ``--lr``, betas 0.9/0.95, no weight decay),
``--batch-size`` sums per step drawn by ``random.Random(--seed)``, initial weights ``sailrl/tiny`` with
``--seed``, one torch thread. It stops after ``--steps`` steps on purpose: the model has learnt the answer
format (a number, then the stop sequence) and part of the table, so RL has something to sharpen::

    python runtime/backends/local/pretrained/make_tiny_arith.py          # rewrites tiny_arith.safetensors next to it

Prints, per 25 steps, the loss and ``p(answer)``: the mean over the 100 prompts of the probability the model
gives the reference answer followed by the stop sequence (teacher-forced; that is the expected ``correct`` of
one rollout sampled at temperature 1). The weights are written as float32 safetensors with these settings
and the final ``p(answer)`` in the file's metadata. Deterministic for given arguments on one torch version.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch
from tinker_cookbook.renderers import TrainOnWhat

from sailrl.runtime.backends.local.weights.tiny import build_tiny_model, save_pretrained_weights
from sailrl.runtime.backends.models import get_renderer, get_tokenizer

OUT = Path(__file__).with_name("tiny_arith.safetensors")


def sums() -> list[tuple[str, str]]:
    """The 100 (question, answer) pairs ``("3+4", "7")``, a and b in 0..9, in order."""
    return [(f"{a}+{b}", str(a + b)) for a in range(10) for b in range(10)]


def render(question: str, answer: str) -> tuple[list[int], int]:
    """Tokens of one rendered sum and the index of the first answer token (role_colon, byte tokenizer)."""
    tok = get_tokenizer("sailrl/tiny")
    renderer = get_renderer("role_colon", tok)
    messages = [{"role": "user", "content": f"{question}="}, {"role": "assistant", "content": answer}]
    model_input, weights = renderer.build_supervised_example(messages, train_on_what=TrainOnWhat.LAST_ASSISTANT_MESSAGE)
    tokens = model_input.to_ints()
    return tokens, int(weights.tolist().index(1.0))


def answer_probability(model: torch.nn.Module, texts: list[tuple[list[int], int]]) -> float:
    """Mean over ``texts`` of p(answer tokens and stop sequence | prompt), teacher-forced."""
    with torch.no_grad():
        total = 0.0
        for tokens, start in texts:
            ids = torch.tensor([tokens])
            logprobs = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
            picked = logprobs.gather(-1, ids[0, 1:, None]).squeeze(-1)
            total += float(picked[start - 1 :].sum().exp())
    return total / len(texts)


def train(steps: int, lr: float, batch_size: int, seed: int, log_every: int = 25) -> tuple[torch.nn.Module, float]:
    """Pretrain and return (model in eval mode, final p(answer))."""
    torch.set_num_threads(1)
    texts = [render(q, a) for q, a in sums()]
    model = build_tiny_model(seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    rng = random.Random(seed)
    for step in range(steps):
        batch = [texts[rng.randrange(len(texts))] for _ in range(batch_size)]
        width = max(len(t) for t, _ in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (tokens, _) in enumerate(batch):
            ids[i, : len(tokens)] = torch.tensor(tokens)
            mask[i, : len(tokens)] = 1
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        targets = ids[:, 1:]
        weight = mask[:, 1:].float()
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                                reduction="none").view_as(weight)
        loss = (nll * weight).sum() / weight.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if (step + 1) % log_every == 0 or step + 1 == steps:
            model.eval()
            p = answer_probability(model, texts)
            model.train()
            print(f"step {step + 1:4d}  loss {loss.item():.4f}  p(answer) {p:.3f}")
    model.eval()
    return model, answer_probability(model, texts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)

    model, p = train(args.steps, args.lr, args.batch_size, args.seed)
    meta = {"steps": str(args.steps), "lr": str(args.lr), "batch_size": str(args.batch_size), "seed": str(args.seed),
            "p_answer": f"{p:.4f}", "torch": torch.__version__}
    save_pretrained_weights(model, args.out, meta)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB), p(answer) {p:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
