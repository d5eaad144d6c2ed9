"""Which rows of an SFT or DPO spec cannot train, and why, in the words the run skips them with: an SFT row whose
conversation has nothing to train on (``runtime/prompts/conversations.py``), a DPO row that is no pair
(``runtime/prompts/pairs.py``) or whose prompt does not render. ``sailrl preflight`` and the studio's Data tab pass
:func:`row_check` to ``load_rows``, so they list the rows the run would skip."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sailrl.runtime.prompts import PromptBuilder, PromptError
from sailrl.runtime.prompts.conversations import ConversationError, conversation
from sailrl.runtime.prompts.pairs import pair_problem
from sailrl.spec.schema import Spec

__all__ = ["row_check"]


def row_check(spec: Spec, prompts: PromptBuilder | None) -> Callable[[dict[str, Any]], str | None]:
    """``row -> reason | None`` for ``load_rows``' ``renderer_check``. ``prompts``: the spec's prompt builder (None
    for an SFT spec whose rows hold whole conversations)."""
    def check(row: dict[str, Any]) -> str | None:
        try:
            if spec.method == "dpo":
                problem = pair_problem(row, spec.dpo.chosen_field, spec.dpo.rejected_field)
                if problem is not None:
                    return problem
                prompts.messages(row)
            else:
                conversation(row, spec, prompts)
        except (ConversationError, PromptError) as exc:
            return str(exc).removeprefix(f"row {row.get('_index')}: ")
        return None
    return check
