"""The reward in plain words, as ``sailrl explain`` prints it, for the compiled script's comment; what a method other
than RL trains, in plain words (``sailrl validate`` and ``sailrl explain``).

In the validation stage (it reads the runtime's reward rule engine, which the rendering stage may not import):
``sailrl compile`` and ``sailrl run`` pass :func:`reward_words` to :func:`sailrl.compiler.render.render_script`.
"""

from __future__ import annotations

from sailrl.runtime.prompts.conversations import sft_words
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.spec.schema import Spec

__all__ = ["method_words", "reward_words"]


def reward_words(spec: Spec) -> list[str]:
    """One sentence per reward rule, then the total and what 'correct' means (``RewardFunction.explain``, what
    ``sailrl explain`` prints); with ``environment:``, the episode's sentences after them (what it prints under
    "Episodes:")."""
    if spec.reward is None:
        return []  # a method without reward rules (sft, dpo, distill from the teacher alone)
    reference = spec.prompt.reference_field if spec.prompt is not None else "answer"
    words = RewardFunction.from_spec(spec.reward, reference).explain()
    if spec.environment is not None:
        words += spec.environment.describe()
    return words


def _held_out(spec: Spec, what: str) -> list[str]:
    t = spec.training
    if spec.dataset.eval is None:
        return []
    every = f", every {t.eval_every} steps" if t.eval_every > 0 else ""
    return [f"The held-out rows' {what} measured before training{every} and at the end."]


def dpo_words(spec: Spec) -> list[str]:
    """What a DPO spec trains, in plain words."""
    dpo, t = spec.dpo, spec.training
    chosen, rejected = (dpo.chosen_field, dpo.rejected_field) if dpo is not None else ("chosen", "rejected")
    beta, batch = (dpo.beta, dpo.batch_size) if dpo is not None else (0.1, 16)
    system = ", prompt.system" if spec.prompt is not None and spec.prompt.system else ""
    return [
        f"Each row is a preference pair: the prompt (prompt.user{system}), then the field {chosen!r} as the chosen "
        f"reply and the field {rejected!r} as the rejected one.",
        "The reference is the starting weights, frozen: its logprob of each reply is computed once per pair. With "
        f"r(y) = beta x (log policy(y) - log reference(y)) summed over the reply's tokens and beta {beta:g}, the "
        "loss is -log sigmoid(r(chosen) - r(rejected)), the mean over the pairs (DPO); nothing is sampled to train.",
        f"{t.steps} steps of {batch} pairs each (the rows in a seeded order, epoch after epoch), Adam at learning "
        f"rate {t.learning_rate:g}; each step logs dpo/loss, dpo/accuracy (pairs whose chosen reply has the higher "
        "r), dpo/margin and both rewards.",
        *_held_out(spec, "DPO loss and accuracy, and how often a sample of their prompts writes the chosen reply "
                         "(eval/chosen_rate), are"),
    ]


def distill_words(spec: Spec) -> list[str]:
    """What an on-policy distillation spec trains, in plain words."""
    d, t = spec.distill, spec.training
    teacher = "the teacher" if d is None else (
        f"the teacher {d.teacher.name}" + (f" (checkpoint {d.teacher.checkpoint})" if d.teacher.checkpoint else ""))
    coef = d.kl_coef if d is not None else 1.0
    rules = ("the reward rules' group-centred advantage plus " if spec.reward is not None else "")
    return [
        f"The student ({spec.model.name}, the LoRA trained) samples {t.groups_per_step} prompts x {t.group_size} "
        f"completions per step; {teacher} reads every token the student sampled and gives its logprob (a "
        "prefill: the teacher samples nothing).",
        f"Each sampled token's advantage is {rules}kl_coef x (teacher logprob - student logprob), kl_coef "
        f"{coef:g}: the loss ({t.loss_fn}) lowers the reverse KL(student || teacher) on the student's own samples; "
        "every group trains, so none is degenerate.",
        f"{t.steps} steps, Adam at learning rate {t.learning_rate:g}; each step logs distill/reverse_kl (nats per "
        "sampled token)" + (" and the reward rules' scores." if spec.reward is not None else
                            "; without reward rules every reward is 0."),
    ]


def method_words(spec: Spec) -> list[str]:
    """What the spec's method trains, in plain words; empty for RL (its reward rules say it)."""
    words = {"sft": sft_words, "dpo": dpo_words, "distill": distill_words}.get(spec.method)
    return words(spec) if words is not None else []
