"""Semantic checks of a spec: what the schema alone cannot say, each problem located, coded and in plain words.

`check_spec` is the one entry point (``sailrl.compiler.validate`` calls it). It reads the loaded YAML through a
`SpecReader` (``reader.py``: values by key path, the problems found), not the validated model, so the checks also
run on a file the schema rejected (or the part of a file before a YAML syntax error) and every problem of a file is
reported together. A value of the wrong type is skipped here (the schema reports it). One module per part of the
spec, each a few plain functions that take the reader, run in this order:

- ``values.py``: control characters from double-quoted escapes, names and paths that fit a file system;
- ``method.py``: keys and sections that only another training method reads;
- ``distill.py``: a distillation teacher whose tokenizer is not the student's;
- ``templates.py``: Jinja2 templates (prompt, warm-up completion, judge rubrics) parse, stay within the sandbox's
  nesting limits, use only declared dataset fields and no attribute the sandbox forbids, and render on an example
  row (the spec's ``examples:`` fields over a row of placeholder values) in the runtime's own bounded sandbox
  (``sailrl.runtime.prompts``);
- ``templates_on_data.py``: the prompt templates rendered on the first rows of a local dataset file;
- ``sft.py``: ``method: sft``: the first data rows' conversations have an assistant turn to train on;
- ``dpo.py``: ``method: dpo``: the pair fields are declared, and the first data rows' pairs are two different
  non-empty completions;
- ``rules.py``: regular expressions compile within the pattern limits (``sailrl.spec.patterns``), rule names are
  unique, reference fields are declared dataset fields;
- ``judges.py``: a judge model its sampler can serve; ``sailrl/tiny-judge`` used as it was taught;
- ``model.py``: the renderer name, the built-in model names, the LoRA rank;
- ``training.py``: group_size >= 2, num_substeps divides groups_per_step, lr_warmup_steps < steps, resume_from is
  a save_state checkpoint; warnings for a learning rate far from tinker_cookbook's advice and kl_discount_factor
  without kl_penalty_coef;
- ``sampling.py``: the Sail completion window; a warning for max_tokens not below the model's context window;
- ``dataset.py``: declared fields, range, eval, local dataset files the loader reads;
- ``values.py`` again: a warning for each number outside its key's usual range (``x-usual-range`` in the schema,
  :func:`usual_range_of`).
"""

from __future__ import annotations

from sailrl.compiler.checks.dataset import LOCAL_DATA_SUFFIXES, check_dataset
from sailrl.compiler.checks.distill import check_distill
from sailrl.compiler.checks.dpo import check_dpo
from sailrl.compiler.checks.judges import check_judges
from sailrl.compiler.checks.method import check_method
from sailrl.compiler.checks.model import check_model
from sailrl.compiler.checks.reader import SpecReader
from sailrl.compiler.checks.rules import check_regexes, check_rules
from sailrl.compiler.checks.sampling import COMPLETION_WINDOWS, RETIRED_WINDOWS, check_sampling
from sailrl.compiler.checks.sft import check_sft
from sailrl.compiler.checks.templates import check_templates
from sailrl.compiler.checks.templates_on_data import check_templates_on_data
from sailrl.compiler.checks.training import check_training
from sailrl.compiler.checks.values import check_control_characters, check_paths, check_usual_ranges, usual_range_of
from sailrl.spec.errors import SpecError
from sailrl.spec.loader import LoadedSpec

__all__ = [
    # The spec layer's tables, as the sections that read them import them (a test holds them to their one home).
    "COMPLETION_WINDOWS",
    "LOCAL_DATA_SUFFIXES",
    "RETIRED_WINDOWS",
    "SpecReader",
    "check_spec",
    "usual_range_of",
]

#: The checks in the order they run: later ones read what earlier ones found (e.g. a path too long for the file
#: system is not looked up; a template that does not parse is not rendered on data).
CHECKS = (
    check_control_characters,
    check_method,
    check_distill,
    check_paths,
    check_templates,
    check_templates_on_data,
    check_sft,
    check_dpo,
    check_regexes,
    check_rules,
    check_judges,
    check_model,
    check_training,
    check_sampling,
    check_dataset,
    check_usual_ranges,
)


def check_spec(loaded: LoadedSpec) -> list[SpecError]:
    """Every semantic problem of ``loaded`` (possibly rejected by the schema; ``loaded.spec`` may be None).

    Returns errors and warnings (``severity``), each with its code; never raises for a user error.
    """
    spec = SpecReader(loaded)
    for check in CHECKS:
        check(spec)
    return spec.errors
