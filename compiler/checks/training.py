"""The ``training:`` section: group_size >= 2 (S214), num_substeps divides groups_per_step (S215), resume_from is a
save_state checkpoint (S216), lr_warmup_steps < steps (S226), dynamic_sampling / difficulty_filter only on a
synchronous run (S234), the learning rate against tinker_cookbook's advice (W120), kl_discount_factor without
kl_penalty_coef (W102)."""

from __future__ import annotations

from sailrl.compiler.checks.reader import SpecReader, schema_default
from sailrl.spec.lr_advice import far_limit, lr_advice, lr_far


def check_training(spec: SpecReader) -> None:
    group = spec.integer(("training", "group_size"))
    if group is not None and group < 2:
        spec.add(("training", "group_size"), "S214", f"group_size must be at least 2, got {group}",
                 "Advantages are rewards minus the mean of their group; with one rollout per group every "
                 "advantage is zero, so nothing trains. Use 4 or more (the Sail guide uses 4).")
    groups = spec.integer(("training", "groups_per_step"))
    sub = spec.integer(("training", "num_substeps"))
    if groups and sub and groups > 0 and sub > 0 and groups % sub and spec.whole("training"):
        divisors = [str(d) for d in range(1, min(groups, 10_000) + 1) if groups % d == 0]
        spec.add(("training", "num_substeps"), "S215",
                 f"num_substeps ({sub}) must divide groups_per_step ({groups}) so every substep gets "
                 "the same number of groups",
                 f"Divisors of {groups}: {', '.join(divisors)}.")
    for key in ("resume_from", "init_from"):
        path = spec.text(("training", key))
        if path is not None and "sampler_weights/" in path:
            what = "resume from it" if key == "resume_from" else "load its weights to start from"
            spec.add(("training", key), "S216",
                     f"this is a sampler checkpoint (sampler_weights/): it holds weights for sampling only, "
                     f"so a run cannot {what}",
                     "A run's training state comes from save_state and has weights/ in its path "
                     "(tinker://.../weights/...; every run saves one at its end): use that path"
                     + (" in training.init_from to start from its weights with a fresh optimizer." if key ==
                        "resume_from" else "."))
    warm = spec.integer(("training", "lr_warmup_steps"))
    steps = spec.integer(("training", "steps"))
    if warm is not None and warm > 0 and spec.whole("training"):
        total = steps if steps is not None else schema_default("TrainingSpec", "steps")
        if isinstance(total, int) and warm >= total:
            spec.add(("training", "lr_warmup_steps"), "S226",
                     f"lr_warmup_steps ({warm}) must be fewer than training.steps ({total}): the learning rate "
                     "would never leave its warm-up",
                     f"Use at most {max(total - 1, 0)} warm-up steps (often 5-10% of the steps), or 0 for none.")
    check_draws(spec)
    check_learning_rate(spec)
    discount = spec.number(("training", "kl_discount_factor"))
    coef = spec.number(("training", "kl_penalty_coef"))
    if discount and discount > 0 and not coef and spec.whole("training"):
        spec.warn(("training", "kl_discount_factor"), "W102",
                  f"kl_discount_factor ({discount:g}) only shapes the KL penalty, and kl_penalty_coef is "
                  f"{'0' if coef is not None else 'not set (0)'}: it has no effect",
                  "Set training.kl_penalty_coef (usually 0.001-0.1) to use a KL penalty, or remove "
                  "kl_discount_factor.")


def check_draws(spec: SpecReader) -> None:
    """S234: dynamic sampling and the difficulty filter decide a step's rows from the groups of the steps before it,
    so they need a synchronous run (an off-policy run draws later steps' rows before this step's are scored)."""
    ahead = spec.integer(("training", "max_steps_off_policy"))
    if not ahead or ahead <= 0:
        return
    for key in ("dynamic_sampling", "difficulty_filter"):
        if spec.get(("training", key)) is not None:
            spec.add(("training", key), "S234",
                     f"training.{key} needs a synchronous run, and max_steps_off_policy is {ahead}: an off-policy "
                     "run draws the rows of later steps before this step's groups are scored",
                     f"Set training.max_steps_off_policy: 0, or remove training.{key}.")


def check_learning_rate(spec: SpecReader) -> None:
    """W120 when the learning rate is more than 10x above (or 100x below) tinker_cookbook's ``get_lr`` for the
    model's LoRA."""
    if not (spec.whole("model") and spec.whole("training")):
        return
    name = spec.get(("model", "name"), schema_default("ModelSpec", "name"))
    lr = spec.number(("training", "learning_rate"))
    if lr is None and spec.get(("training", "learning_rate")) is None:
        lr = schema_default("TrainingSpec", "learning_rate")
    if not isinstance(name, str) or lr is None or not lr_far(name, lr):
        return
    spec.warn(("training", "learning_rate"), "W120",
              f"{lr_advice(name, lr)}, more than {far_limit(name, lr):g}x away",
              "get_lr is calibrated on supervised LoRA fine-tuning (10x the full fine-tuning rate); RL runs "
              "often use a few times less. If the value is meant, keep it: this is a warning, and "
              "`sailrl validate` still passes.")
