"""The ``sampling:`` section: a Sail completion window the SDK takes (S217 retired, S218 unknown), and max_tokens
below the model's context window (W103)."""

from __future__ import annotations

from sailrl.compiler.checks.reader import SpecReader, schema_default
from sailrl.spec.constants import COMPLETION_WINDOWS, RETIRED_WINDOWS
from sailrl.spec.messages import did_you_mean_text
from sailrl.spec.models import context_window


def check_sampling(spec: SpecReader) -> None:
    window = spec.text(("sampling", "completion_window"))
    if window is not None and window not in COMPLETION_WINDOWS:
        why = RETIRED_WINDOWS.get(window)
        if why:
            spec.add(("sampling", "completion_window"), "S217",
                     f"completion_window '{window}' is {why} in the current sail SDK; use 'balanced' or 'flex'",
                     "The Sail guide's `completion_window: priority` predates the SDK change. "
                     "Write `completion_window: balanced` (the default) or `flex`.")
        else:
            spec.add(("sampling", "completion_window"), "S218",
                     f"completion_window must be 'balanced' or 'flex', got '{window}'"
                     + did_you_mean_text(window, COMPLETION_WINDOWS))
    max_tokens = spec.integer(("sampling", "max_tokens"))
    if max_tokens is None or not spec.path_ok(("model", "name")) or not spec.whole("model"):
        return

    name = spec.text(("model", "name")) or schema_default("ModelSpec", "name")
    try:
        window_tokens, source = context_window(str(name), spec.loaded.base_dir)
    except (OSError, ValueError):
        return
    if window_tokens is not None and max_tokens >= window_tokens:
        spec.warn(("sampling", "max_tokens"), "W103",
                  f"max_tokens ({max_tokens:,}) is not below the context window of '{name}' "
                  f"({window_tokens:,} tokens, from {source}): the prompt and the completion must fit in it "
                  "together",
                  f"Use a max_tokens well below {window_tokens:,}, leaving room for the longest prompt "
                  "(`sailrl preflight` shows prompt lengths).")
