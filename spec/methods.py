"""The training method a spec declares (``method:``) and each method's own section.

``rl`` (the default: every spec written before ``method:`` existed is RL) samples rollouts and scores them with the
reward rules; ``sft`` trains on demonstrations (``sft:``); ``dpo`` on preference pairs (``dpo:``); ``distill``
samples from the student and learns from a teacher's logprobs on the student's tokens (``distill:``). Which other
keys belong to which method is :data:`METHOD_KEYS`; the validation stage (``compiler/checks/method.py``) reports a
key written for another method at its line.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sailrl.spec.base import SpecModel, Text, usual_range

Method = Literal["rl", "sft", "dpo", "distill"]
METHODS: tuple[str, ...] = ("rl", "sft", "dpo", "distill")

#: What each method does, in one line (messages, ``sailrl explain``, the docs).
METHOD_WORDS = {
    "rl": "reinforcement learning: rollouts sampled and scored by the reward rules",
    "sft": "supervised fine-tuning on demonstrations",
    "dpo": "direct preference optimisation on chosen/rejected pairs",
    "distill": "on-policy distillation from a teacher model",
}

#: Keys that only some methods read (a key path -> the methods that read it). A key not listed here is read by
#: every method. A spec that writes a listed key under another method gets a located error naming its method.
METHOD_KEYS: dict[tuple[str, ...], frozenset[str]] = {
    ("sft",): frozenset({"sft"}),
    ("dpo",): frozenset({"dpo"}),
    ("distill",): frozenset({"distill"}),
    ("environment",): frozenset({"rl"}),
    ("training", "group_size"): frozenset({"rl", "distill"}),
    ("training", "groups_per_step"): frozenset({"rl", "distill"}),
    ("training", "loss_fn"): frozenset({"rl", "distill"}),
    ("training", "loss_fn_config"): frozenset({"rl", "distill"}),
    ("training", "num_substeps"): frozenset({"rl", "distill"}),
    ("training", "advantage_scale"): frozenset({"rl"}),
    ("training", "kl_penalty_coef"): frozenset({"rl"}),
    ("training", "kl_discount_factor"): frozenset({"rl"}),
    ("training", "max_steps_off_policy"): frozenset({"rl"}),
    ("training", "on_all_degenerate"): frozenset({"rl"}),
    ("training", "dynamic_sampling"): frozenset({"rl"}),
    ("training", "difficulty_filter"): frozenset({"rl"}),
    ("training", "warmup"): frozenset({"rl"}),
    ("sampling", "on_policy_mismatch"): frozenset({"rl", "distill"}),
    ("sampling", "on_policy_kl_threshold"): frozenset({"rl", "distill"}),
}


class SftSpec(SpecModel):
    """Supervised fine-tuning: each row becomes a conversation whose assistant turns are trained (cross_entropy)."""

    completion: Text | None = Field(
        None,
        description=(
            "Jinja2 template of the assistant's reply for a row, after the prompt's messages (e.g. '{{ answer }}'). "
            "Default: the reference answer, '{{ <prompt.reference_field> }}'."
        ),
    )
    messages_field: Text | None = Field(
        None,
        description="A dataset field holding the whole conversation (a list of {role, content}); then no prompt: "
                    "section is needed and every assistant turn is trained.",
    )
    batch_size: int = Field(32, gt=0, le=65_536, description="Conversations per step.")


class DpoSpec(SpecModel):
    """Direct preference optimisation: per prompt a chosen and a rejected completion; the loss raises the chosen
    one's log-ratio to the reference model over the rejected one's."""

    chosen_field: Text = Field("chosen", description="The dataset field holding the preferred completion.")
    rejected_field: Text = Field("rejected", description="The dataset field holding the dispreferred completion.")
    beta: float = Field(0.1, gt=0, description="DPO's beta: how far the policy may move from the reference model.",
                        json_schema_extra=usual_range(0.01, 1.0))
    batch_size: int = Field(16, gt=0, le=65_536, description="Pairs per step.")


class TeacherSpec(SpecModel):
    """The model the student learns from."""

    name: Text = Field(description="The teacher's base model (e.g. Qwen/Qwen3-8B, or sailrl/tiny-arith locally).")
    checkpoint: Text | None = Field(
        None, description="A sampler checkpoint of the teacher (tinker://... or local://...), or the folder of a "
                          "finished run (relative to the spec) whose final adapter is the teacher; default: its base.")


class DistillSpec(SpecModel):
    """On-policy distillation: the student samples, the teacher scores the student's tokens, and each token's
    advantage is the teacher's logprob minus the student's (reverse KL)."""

    teacher: TeacherSpec = Field(description="The teacher model.")
    kl_coef: float = Field(1.0, gt=0, description="Weight of the reverse-KL advantage (added to the reward rules' "
                                                  "advantage when the spec has reward rules).",
                           json_schema_extra=usual_range(0.01, 10.0))
