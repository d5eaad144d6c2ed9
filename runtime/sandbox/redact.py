"""Secrets never written: the values of this process's credential variables, replaced by a marker in what sailrl
writes or shows.

A run knows the secrets it was given: every environment variable whose name looks like a credential
(:data:`SECRET_NAME`: ``TINKER_API_KEY``, ``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``, a proxy URL, ...). Whatever
produced a text -- a tool's result, a completion, a rule's printed output, an error message -- :func:`redact`
replaces each such value (at least :data:`MIN_SECRET_CHARS` characters, as written and as JSON escapes it) with
:data:`MARKER` before it reaches ``rollouts.jsonl``, ``metrics.jsonl``, the console, ``sailrl show`` or the
studio. It stands behind the python tool's sandbox, which gives the model's code no key to print in the first
place.
"""

from __future__ import annotations

import functools
import json
import os
import re

__all__ = ["MARKER", "MIN_SECRET_CHARS", "SECRET_NAME", "redact", "secret_values"]

#: What a secret value becomes.
MARKER = "[secret removed]"
#: Shortest value treated as a secret (a shorter one would replace ordinary words and numbers).
MIN_SECRET_CHARS = 8
#: Parts of a variable's name that mark it as a credential.
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|SESSION|COOKIE|PRIVATE|_PROXY$|^PROXY", re.I)


def secret_values(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """The values of the credential variables of ``environ`` (default: this process's), longest first."""
    env = os.environ if environ is None else environ
    found = {v for k, v in env.items() if SECRET_NAME.search(k) and len(v) >= MIN_SECRET_CHARS}
    return tuple(sorted(found, key=lambda v: (-len(v), v)))


@functools.lru_cache(maxsize=8)
def _pattern(values: tuple[str, ...]) -> re.Pattern[str] | None:
    forms: set[str] = set()
    for v in values:
        forms.add(v)
        forms.add(json.dumps(v, ensure_ascii=False)[1:-1])
        forms.add(json.dumps(v)[1:-1])
    if not forms:
        return None
    return re.compile("|".join(re.escape(f) for f in sorted(forms, key=lambda f: (-len(f), f))))


def redact(text: str, environ: dict[str, str] | None = None) -> str:
    """``text`` with every secret value of ``environ`` (default: this process's) replaced by :data:`MARKER`."""
    pattern = _pattern(secret_values(environ))
    if pattern is None or not text:
        return text
    return pattern.sub(MARKER, text)
