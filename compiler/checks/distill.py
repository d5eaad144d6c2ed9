"""``distill:``: the teacher must share the student's tokenizer (S258), since it scores the student's own tokens.

A tokenizer is known by family from the model's name, without loading it: the built-in models (one byte
tokenizer), and the remote families whose members share one vocabulary. A name of no known family (a local folder,
a GGUF file, another hub id) is not judged here; the run compares the loaded tokenizers when it opens the teacher.
"""

from __future__ import annotations

from sailrl.compiler.checks.reader import SpecReader
from sailrl.spec.models import is_builtin

#: Lower-cased name prefixes -> the tokenizer family their models share; first match wins.
TOKENIZER_FAMILIES: tuple[tuple[str, str], ...] = (
    ("qwen/qwen3-", "Qwen3"),
    ("meta-llama/llama-3", "Llama 3"),
    ("moonshotai/kimi-k2", "Kimi K2"),
    ("deepseek-ai/deepseek-v3", "DeepSeek-V3"),
    ("openai/gpt-oss-", "gpt-oss"),
)


def tokenizer_family(model_name: str) -> str | None:
    """The tokenizer family of ``model_name``, or None when its name does not tell."""
    if is_builtin(model_name):
        return "byte (the built-in models')"
    low = model_name.lower()
    return next((family for prefix, family in TOKENIZER_FAMILIES if low.startswith(prefix)), None)


def check_distill(spec: SpecReader) -> None:
    if spec.get(("method",)) != "distill":
        return
    teacher, student = spec.text(("distill", "teacher", "name")), spec.text(("model", "name"))
    if teacher is None or student is None:
        return  # the schema reports a missing or mistyped name
    a, b = tokenizer_family(teacher), tokenizer_family(student)
    if a is None or b is None or a == b:
        return
    spec.add(("distill", "teacher", "name"), "S258",
             f"the teacher {teacher} has the {a} tokenizer and the student {student} the {b} one; the teacher "
             "scores the student's own tokens, so both need one tokenizer",
             f"Pick a teacher with the {b} tokenizer, or a student with the {a} one.")
