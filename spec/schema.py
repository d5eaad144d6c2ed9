"""The spec: one YAML file describing a fine-tuning run (RL unless `method:` names another method).

Defaults reproduce the run of Sail's "RL fine-tuning with Tinker" guide: Kimi K2.6, LoRA rank 32,
16 groups x 4 samples per step, learning rate 1e-5, ``importance_sampling``, 7 steps, max_tokens 1024,
temperature 1.0, sampled on Sail. (The guide's ``completion_window: priority`` is retired in the current
sail SDK; the default here is ``balanced``.)

Only shapes, types, per-field bounds and usual ranges (``usual_range``: outside them the validation stage warns)
live here. Checks that need several fields or other libraries (templates parse and use declared fields,
renderer names, divisibility) are in the validation stage (``sailrl.compiler.checks``) so that every problem is
collected and reported together.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from sailrl.spec.base import SpecModel, Text, usual_range
from sailrl.spec.draws import DifficultyFilterSpec, DynamicSamplingSpec
from sailrl.spec.environment import EnvironmentSpec
from sailrl.spec.errors import SpecValueError
from sailrl.spec.methods import DistillSpec, DpoSpec, Method, SftSpec
from sailrl.spec.pricing import PricingSpec
from sailrl.spec.rewards import RewardExample, RewardSpec

SPEC_VERSION = 1
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


class ModelSpec(SpecModel):
    """The base model and the LoRA adapter trained on it."""

    name: Text = Field(
        "moonshotai/Kimi-K2.6",
        description=(
            "Base model: a Tinker model name (e.g. moonshotai/Kimi-K2.6, Qwen/Qwen3-8B); on the embedded (local) "
            "backend also a built-in model ('sailrl/tiny', random weights; 'sailrl/tiny-arith', pretrained on "
            "single-digit sums; 'sailrl/tiny-tools', tiny-arith taught to call the calculator tool), a local "
            "Hugging Face model folder, a .gguf file (pip install 'sailrl[gguf]') or a "
            "hub id (downloaded once into the Hugging Face cache). A relative path is looked up next to the spec file, "
            "then in the current folder."
        ),
    )
    renderer: Text | None = Field(
        None,
        description=(
            "tinker_cookbook renderer that turns a conversation into tokens (e.g. kimi_k26, qwen3, role_colon), or "
            "chat_template (the tokenizer's own chat template). Default: role_colon for the built-in models, "
            "chat_template for a local folder or .gguf file and for a hub id on the embedded backend (sampler: local; "
            "unless its cached tokenizer has no chat template), else the renderer tinker_cookbook recommends."
        ),
    )
    lora_rank: int = Field(32, description="LoRA rank: a positive power of two (1, 2, 4, ... 512).",
                           json_schema_extra=usual_range(1, 128))
    train_attn: bool = Field(True, description="Train LoRA adapters on the attention projections.")
    train_mlp: bool = Field(True, description="Train LoRA adapters on the MLP projections.")
    train_unembed: bool = Field(True, description="Train a LoRA adapter on the unembedding (lm_head).")
    seed: int = Field(0, description="Seed for LoRA initialisation, data order and sampling.")


class EvalSplitSpec(SpecModel):
    """A held-out evaluation split: a named dataset split, or rows carved from the training data."""

    split: Text | None = Field(None, description="A named split of the same dataset (e.g. test).")
    count: int | None = Field(None, gt=0, description="Carve this many rows off the training data.")
    fraction: float | None = Field(None, gt=0, lt=1, description="Carve this fraction of the training rows.")
    limit: int | None = Field(None, gt=0, description="Use at most this many evaluation rows.")


class DatasetSpec(SpecModel):
    """Where the prompts and reference answers come from."""

    source: Text = Field(
        description=(
            "A Hugging Face dataset id (e.g. openai/gsm8k) or a local file path ending in .jsonl, .json, .csv or "
            ".parquet (relative paths are relative to the spec file)."
        ),
    )
    config: Text | None = Field(None, description="Hugging Face dataset config name (e.g. main for gsm8k).")
    split: Text = Field("train", description="Dataset split to train on.")
    fields: dict[Text, Text] | list[Text] | None = Field(
        None,
        description=(
            "The names the template and reward rules use, mapped to dataset columns ({question: problem}). "
            "A list means each name is its own column. Default: every column under its own name."
        ),
    )
    limit: int | None = Field(None, gt=0, description="Use at most this many rows (after range, before shuffling).")
    range: tuple[int, int] | None = Field(None, description="Use rows [start, end) of the split.")
    shuffle: bool = Field(True, description="Shuffle the rows once, with shuffle_seed.")
    shuffle_seed: int | None = Field(None, description="Seed of the shuffle (default: model.seed).")
    eval: EvalSplitSpec | None = Field(None, description="Optional held-out evaluation split.")


class PromptSpec(SpecModel):
    """How a dataset row becomes the conversation the model sees."""

    system: Text | None = Field(None, description="Optional system message (a Jinja2 template over dataset fields).")
    user: Text = Field(
        description=(
            "The user message: a Jinja2 template over dataset fields, e.g. '{{ question }} Answer in \\boxed{}.'"
        ),
    )
    reference_field: Text = Field("answer", description="The dataset field holding the reference answer.")


class WarmupSpec(SpecModel):
    """Optional supervised warm-up (cross_entropy on the reference answers) before RL."""

    steps: int = Field(0, ge=0, description="Supervised steps before RL (0 = no warm-up).")
    batch_size: int = Field(32, gt=0, description="Examples per supervised step.")
    learning_rate: float = Field(1e-4, gt=0, description="Adam learning rate for the warm-up.",
                                 json_schema_extra=usual_range(1e-7, 0.1))
    completion: Text | None = Field(
        None,
        description=(
            "Jinja2 template of the target assistant message for a row. Default: the reference answer, "
            "i.e. '{{ <prompt.reference_field> }}'."
        ),
    )


class TrainingSpec(SpecModel):
    """The RL loop: steps, batch shape, optimiser and loss."""

    steps: int = Field(7, gt=0, le=1_000_000, description="Number of RL steps (optimizer updates).")
    group_size: int = Field(
        4, le=1024, description="Rollouts sampled per prompt; advantages are centred within a group. >= 2.",
        json_schema_extra=usual_range(4, 64),
    )
    groups_per_step: int = Field(16, gt=0, le=65_536, description="Prompts (groups) per step: the batch.")
    learning_rate: float = Field(1e-5, gt=0, description="Adam learning rate (Tinker AdamParams).",
                                 json_schema_extra=usual_range(1e-7, 1e-2))
    beta1: float = Field(0.9, ge=0, lt=1, description="Adam beta1.")
    beta2: float = Field(0.95, ge=0, lt=1, description="Adam beta2.")
    eps: float = Field(1e-12, gt=0, description="Adam epsilon.")
    loss_fn: Literal["importance_sampling", "ppo", "cispo", "dro"] = Field(
        "importance_sampling",
        description=(
            "Tinker RL loss (see the Tinker loss documentation). dro: its quadratic penalty also covers prompt "
            "tokens, and sailrl feeds it group-centred advantages, not DRO's soft estimate; prefer the others."
        ),
    )
    loss_fn_config: dict[Text, float] | None = Field(
        None,
        description=(
            "Loss parameters: clip_low_threshold / clip_high_threshold for ppo and cispo (default 0.8 / 1.2), "
            "beta for dro."
        ),
    )
    num_substeps: int = Field(1, gt=0, description="Optimizer updates per step; must divide groups_per_step.")
    advantage_scale: Literal["none", "group_std", "batch_std"] = Field(
        "none",
        description=(
            "How the group-centred advantages (reward minus the group's mean) are scaled. none: not scaled "
            "(tinker_cookbook's default; TRL scale_rewards='none'). group_std: divided by the group's reward "
            "standard deviation + 1e-6 (GRPO; TRL 'group'). batch_std: divided by the standard deviation of every "
            "reward of the step + 1e-6 (TRL 'batch'). A group whose rewards are all equal stays degenerate."
        ),
    )
    kl_penalty_coef: float = Field(
        0.0, ge=0, le=100,
        description=(
            "KL penalty to the base model, as part of the reward (tinker_cookbook rl.metrics.incorporate_kl_penalty"
            "): each sampled token's advantage gets coef * (mean - own) of log p_policy - log p_base. 0 = off."
        ),
        json_schema_extra=usual_range(0.001, 0.1, off=0),
    )
    kl_discount_factor: float = Field(
        0.0, ge=0, le=1,
        description=(
            "With kl_penalty_coef > 0: 0 penalises each token for its own KL; gamma in (0, 1] for the discounted "
            "sum of the KL of the tokens after it (tinker_cookbook's kl_discount_factor)."
        ),
    )
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant",
        description=(
            "Learning-rate schedule over the RL steps after lr_warmup_steps (tinker_cookbook "
            "utils.lr_scheduling): constant, linear decay to 0, or cosine decay to 0."
        ),
    )
    lr_warmup_steps: int = Field(
        0, ge=0,
        description=(
            "Steps of linear learning-rate warm-up from learning_rate / (lr_warmup_steps + 1); fewer than steps."
        ),
    )
    max_steps_off_policy: int = Field(
        0, ge=0, le=16,
        description=(
            "0: synchronous (every step samples from the checkpoint it then trains). K > 0: sampling for the next "
            "K steps runs while earlier steps train (tinker_cookbook AsyncConfig.max_steps_off_policy); a group "
            "sampled more than K steps before the step that trains on it is dropped and counted."
        ),
    )
    max_cost_usd: float | None = Field(
        None, gt=0,
        description=(
            "Budget: stop at a step boundary before the next step would take the estimated cost above this (state "
            "saved; resume with a larger budget). Needs prices (pricing:) for the services the run uses."
        ),
    )
    save_every: int = Field(
        0, ge=0, description="Save resumable state (save_state) every N steps; 0 = only at the end."
    )
    eval_every: int = Field(0, ge=0, description="Evaluate on the held-out split every N steps; 0 = never.")
    on_all_degenerate: Literal["skip", "stop"] = Field(
        "skip",
        description=(
            "When every group of a step scored the same (no gradient): skip the step with a warning, or stop the run."
        ),
    )
    resume_from: Text | None = Field(
        None, description="A save_state checkpoint (tinker://.../weights/...) to resume from, optimizer state included."
    )
    init_from: Text | None = Field(
        None,
        description=(
            "The weights that start the run (fresh optimizer, step 1): a save_state checkpoint (tinker://.../weights/"
            "... or local://.../weights/...), or an earlier run's directory, relative to the spec (its final saved "
            "state; it must hold a finished run of this model and LoRA rank)."
        ),
    )
    warmup: WarmupSpec | None = Field(None, description="Optional supervised warm-up before RL.")
    dynamic_sampling: DynamicSamplingSpec | None = Field(
        None, description="Draw more groups until the step has groups_per_step groups with signal (DAPO's dynamic "
                          "sampling); needs max_steps_off_policy 0.")
    difficulty_filter: DifficultyFilterSpec | None = Field(
        None, description="Rest rows whose groups keep coming out degenerate (all right or all wrong); needs "
                          "max_steps_off_policy 0.")
    checkpoint_ttl_s: int = Field(
        3600, ge=3600,
        description=(
            "Seconds per-step sampler checkpoints (and their signed URLs) live before expiring; Tinker's minimum "
            "is 3600. Keep it longer than a step's rollouts and evaluation take."
        ),
    )


class SamplingSpec(SpecModel):
    """How rollouts are sampled."""

    sampler: Literal["sail", "tinker", "local"] = Field(
        "sail",
        description=(
            "sail: Sail's inference fleet samples from each new Tinker checkpoint. tinker: Tinker's own sampling "
            "client. local: the embedded backend (no keys; also trains locally)."
        ),
    )
    max_tokens: int = Field(1024, gt=0, le=1_048_576, description="Maximum completion tokens per rollout.")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature.",
                               json_schema_extra=usual_range(0.5, 1.5))
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling threshold.")
    stop: list[Text] | None = Field(
        None, description="Stop sequences; default: the renderer's stop sequences."
    )
    completion_window: Text = Field(
        "balanced", description="Sail completion window: balanced or flex (priority and 15m are retired)."
    )
    poll_deadline_s: float = Field(
        1200.0, ge=1, le=86_400,
        description=(
            "Seconds one Sail response may stay unfinished before that attempt counts as failed and is retried "
            "(3 attempts per rollout, then its group is dropped). Default 1200 (20 minutes, the sail SDK's own "
            "poll timeout); 1 to 86400."
        ),
    )
    on_policy_mismatch: Literal["warn", "stop"] = Field(
        "warn",
        description=(
            "After each update the sampler's logprobs are compared with the learner's (sampler-vs-learner KL). "
            "Above on_policy_kl_threshold: warn, or stop the run with state saved. A mismatch means the rollouts "
            "did not come from the checkpoint just trained (Sail serving the base model, a stale checkpoint, a "
            "renderer or tokenizer mismatch). Not checked on steps sampled off-policy (max_steps_off_policy > 0) or "
            "at a temperature other than 1, whose sampler logprobs differ from the learner's by design."
        ),
    )
    on_policy_kl_threshold: float = Field(
        0.01, gt=0,
        description=(
            "Threshold on the sampler-vs-learner KL estimate optim/kl_sample_train_v2 (nats per sampled token) "
            "for on_policy_mismatch."
        ),
    )


class OutputSpec(SpecModel):
    """Where the run writes metrics, config and checkpoints."""

    run_dir: Text = Field("runs/{name}", description="Run directory; {name} is the spec's name.")
    wandb_project: Text | None = Field(None, description="Log to Weights & Biases when installed and set.")
    log_rollouts: Literal["all"] | int = Field(
        16,
        description=(
            "Rollouts kept in rollouts.jsonl (prompt, completion, each rule's score and why, total, advantage, "
            "sampler checkpoint; read them with `sailrl show`): the first N groups of each step (default 16, about "
            "0.9 MB a step for 16 groups x 16 rollouts of ~1,500 characters), all, or 0 for none. Eval rollouts too."
        ),
    )

    @field_validator("log_rollouts")
    @classmethod
    def _log_rollouts(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool) and v < 0:
            raise ValueError("log_rollouts is 'all', 0 (none) or a number of groups per step >= 1")
        return v


class Spec(SpecModel):
    """A fine-tuning run: RL by default, or the method ``method:`` names."""

    version: Literal[1] = Field(SPEC_VERSION, description="Spec language version.")
    method: Method = Field(
        "rl", description="The training method: rl (rollouts scored by reward rules), sft (demonstrations), dpo "
                          "(preference pairs) or distill (on-policy distillation from a teacher).")
    name: Text = Field(
        description=(
            "Run name: used for the run directory and checkpoint names. Letters, digits, '.', '_' and '-', "
            "starting with a letter or digit (e.g. gsm8k-qwen3-8b)."
        ),
    )

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        if not RUN_NAME.fullmatch(v):
            raise SpecValueError("S111",
                f"the run name {v!r} cannot name checkpoints: use letters, digits, '.', '_' and '-', starting "
                "with a letter or digit, at most 100 characters (e.g. my-first-run)"
            )
        return v
    description: Text | None = Field(None, description="Free text.")
    model: ModelSpec = Field(default_factory=ModelSpec, description="Base model and LoRA.")
    dataset: DatasetSpec = Field(description="Training data.")
    prompt: PromptSpec | None = Field(
        None, description="Prompt template and reference answer field (every method but sft with messages_field).")
    reward: RewardSpec | None = Field(
        None, description="Reward rules (rl: required; distill: optional, added to the teacher's signal; sft: "
                          "optional, scores the evaluation samples; dpo: none).")
    training: TrainingSpec = Field(default_factory=TrainingSpec, description="The RL loop.")
    sampling: SamplingSpec = Field(default_factory=SamplingSpec, description="Rollout sampling.")
    output: OutputSpec = Field(default_factory=OutputSpec, description="Run directory and logging.")
    pricing: PricingSpec = Field(default_factory=PricingSpec, description="USD per million tokens per service.")
    examples: list[RewardExample] = Field(
        default_factory=list, description="Worked reward examples that `sailrl validate` scores and checks."
    )
    environment: EnvironmentSpec | None = Field(
        None,
        description=(
            "Episodes of more than one turn: tools the model may call and feedback turns (absent: one prompt, one "
            "completion)."
        ),
    )
    sft: SftSpec | None = Field(None, description="method: sft: how rows become conversations.")
    dpo: DpoSpec | None = Field(None, description="method: dpo: the pairs and beta.")
    distill: DistillSpec | None = Field(None, description="method: distill: the teacher.")

    @model_validator(mode="wrap")
    @classmethod
    def _method_sections(cls, data: Any, handler: Any) -> Spec:
        """The sections ``method`` needs (rl: prompt and reward; sft: prompt unless sft.messages_field; dpo:
        prompt; distill: prompt and distill), each missing one a ``missing`` error beside the other schema
        problems, so a file missing several sections hears of all of them at once; sft: and dpo: default."""
        missing = _missing_sections(data) if isinstance(data, dict) else []
        try:
            spec = handler(data)
        except ValidationError as exc:
            if not missing:
                raise
            errors = [e for e in exc.errors() if tuple(e["loc"])[:1] not in {m["loc"] for m in missing}]
            raise ValidationError.from_exception_data(exc.title, [*errors, *missing]) from None
        if missing:
            raise ValidationError.from_exception_data(cls.__name__, missing)
        if spec.method == "sft" and spec.sft is None:
            spec.sft = SftSpec()
        if spec.method == "dpo" and spec.dpo is None:
            spec.dpo = DpoSpec()
        return spec

    def resolved(self) -> dict[str, Any]:
        """The spec with defaults filled in, as plain JSON-able data (aliases used). ``environment`` appears only
        when the spec has one (a single-turn spec resolves as it did before the section existed), ``pricing.judge``
        only when a judge price is written."""
        data = self.model_dump(mode="json", by_alias=True)
        for key in ("environment", "sft", "dpo", "distill", "reward", "prompt"):
            if data.get(key) is None:
                data.pop(key, None)  # an unused section stays out, so a spec without it resolves as before
        if data.get("method") == "rl":
            data.pop("method")  # RL specs resolve (and compile) as they did before method: existed
        for key in ("dynamic_sampling", "difficulty_filter"):
            if data.get("training", {}).get(key, 0) is None:
                data["training"].pop(key)  # options left out stay out: a spec without them compiles as before
        if data.get("pricing", {}).get("judge") == {"input": None, "output": None}:
            data["pricing"].pop("judge")  # judge prices appear only when written (a spec without compiles as before)
        return data


def _missing_sections(data: dict[str, Any]) -> list[dict[str, Any]]:
    """``missing`` errors (pydantic's shape) for the sections the spec's method needs and the file lacks."""
    method = data.get("method", "rl")
    needed = {"rl": ("prompt", "reward"), "sft": ("prompt",), "dpo": ("prompt",),
              "distill": ("prompt", "distill")}.get(method if isinstance(method, str) else "", ())
    sft = data.get("sft")
    if method == "sft" and isinstance(sft, dict) and sft.get("messages_field"):
        needed = ()  # the conversations come whole from the data
    return [{"type": "missing", "loc": (key,), "input": data} for key in needed if data.get(key) is None]


def every_due(every: int, step: int) -> bool:
    """Whether RL step ``step`` (numbered from 1) is one of an ``*_every`` field's steps (``eval_every``,
    ``save_every``): every ``every`` steps, never when ``every`` is 0. The loop and the cost estimate both ask here."""
    return every > 0 and step % every == 0


JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a spec file, for editors (yaml-language-server) and the docs.

    Keys are the YAML spellings (aliases such as ``from``); ``additionalProperties: false`` everywhere,
    as the loader refuses unknown keys.
    """
    schema = Spec.model_json_schema(by_alias=True, mode="validation")
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "title": "sailrl spec",
        "description": (
            f"sailrl spec language version {SPEC_VERSION}: one YAML file describing a fine-tuning run -- by "
            "default an RL fine-tuning run (model + LoRA, dataset, prompt template, reward rules, training loop, "
            "sampling); method: sft, dpo or distill for the other methods, whose sections say what each needs. "
            "Reference: docs/spec-reference.md."
        ),
        **{k: v for k, v in schema.items() if k not in ("title", "description")},
    }
