"""A dataset row -> the conversation SFT trains on (``method: sft``).

Two ways, as ``sft:`` says:

- **prompt + completion**: ``prompt.system`` / ``prompt.user`` rendered over the row (the RL prompt), then one
  assistant turn rendered from ``sft.completion`` (default: the reference answer, ``{{ <prompt.reference_field>
  }}``);
- **messages**: ``sft.messages_field`` names a field holding the whole conversation, a list of ``{role,
  content}`` messages (roles system, user, assistant); every assistant turn is trained.

Either way a conversation with an empty assistant turn has nothing to train on: :class:`ConversationError` (the
run skips the row, ``sailrl validate`` reports the first data rows as S259 / S260). Templates render in the
prompts' bounded sandbox. Imports neither torch nor tinker: the validation stage uses this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sailrl.runtime.prompts import PromptBuilder, render_template
from sailrl.spec.errors import DataError
from sailrl.spec.schema import Spec

__all__ = ["ROLES", "ConversationError", "completion_template", "conversation", "messages_problem", "sft_words"]

#: The roles a message of ``sft.messages_field`` may have.
ROLES = ("system", "user", "assistant")


class ConversationError(DataError):
    """A row whose conversation cannot be trained on. ``kind``: ``empty`` (an assistant turn with no text: S259)
    or ``messages`` (the messages field is not a list of {role, content} with an assistant turn: S260)."""

    code = "E124"

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def completion_template(spec: Spec) -> str:
    """``sft.completion``, else the reference answer field as a template."""
    sft = spec.sft
    if sft is not None and sft.completion is not None:
        return sft.completion
    field = spec.prompt.reference_field if spec.prompt is not None else "answer"
    return "{{ " + field + " }}"


def messages_problem(value: Any) -> tuple[str, str] | None:
    """``(kind, what is wrong)`` with a messages field's value (see :class:`ConversationError`), else None."""
    if not isinstance(value, list):
        return "messages", f"is {type(value).__name__}, not a list of {{role, content}} messages"
    for i, m in enumerate(value):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            return "messages", f"message {i} is not a {{role, content}} mapping"
        if m["role"] not in ROLES:
            return "messages", f"message {i} has role {m['role']!r}; roles are {', '.join(ROLES)}"
        if not isinstance(m["content"], str):
            return "messages", f"message {i} ({m['role']}) has content of type {type(m['content']).__name__}, " \
                               "not text"
    assistant = [i for i, m in enumerate(value) if m["role"] == "assistant"]
    if not assistant:
        return "messages", "has no assistant message, so nothing would be trained"
    empty = [i for i in assistant if not value[i]["content"].strip()]
    if empty:
        return "empty", f"message {empty[0]} (assistant) is empty, so it has nothing to train on"
    return None


def conversation(row: Mapping[str, Any], spec: Spec, prompts: PromptBuilder | None) -> list[dict[str, str]]:
    """The conversation of ``row``: the prompt's messages and the rendered completion, or the messages field's
    list. ``prompts``: the spec's prompt builder (None with ``sft.messages_field``). Raises
    :class:`ConversationError`, or :class:`~sailrl.runtime.prompts.PromptError` for a template that fails on it."""
    sft = spec.sft
    field = sft.messages_field if sft is not None else None
    if field is not None:
        value = row.get(field)
        problem = messages_problem(value)
        if problem is not None:
            raise ConversationError(f"row {row.get('_index')}: {field} {problem[1]}", kind=problem[0])
        return [{"role": str(m["role"]), "content": str(m["content"])} for m in value]
    if prompts is None:
        raise ValueError("a spec without sft.messages_field needs its prompt builder")
    reply = render_template(completion_template(spec), row, template="sft.completion", row_index=row.get("_index"),
                            field_names=prompts.field_names)
    if not reply.strip():
        raise ConversationError(f"row {row.get('_index')}: sft.completion renders to an empty reply, so the row "
                                "has nothing to train on", kind="empty")
    return [*prompts.conversation(row), {"role": "assistant", "content": reply}]


def sft_words(spec: Spec) -> list[str]:
    """What an SFT spec trains, in plain words (``sailrl explain``, ``sailrl validate``)."""
    sft, t = spec.sft, spec.training
    if sft is not None and sft.messages_field is not None:
        rows = (f"Each row's field {sft.messages_field!r} holds its conversation (a list of role/content messages); "
                "every assistant message in it is trained.")
    else:
        source = "sft.completion" if sft is not None and sft.completion is not None else \
            f"the reference answer (the field {completion_template(spec)[3:-3]!r})"
        system = ", prompt.system" if spec.prompt is not None and spec.prompt.system else ""
        rows = f"Each row becomes a conversation: the prompt (prompt.user{system}), then {source} as the assistant's reply."
    out = [rows,
           "The loss is cross_entropy on the assistant tokens only (the prompt has weight 0; each conversation's "
           "weights sum to 1, so every conversation counts the same).",
           f"{t.steps} steps of {sft.batch_size if sft else 32} conversations each (the rows in a seeded order, "
           f"epoch after epoch), Adam at learning rate {t.learning_rate:g}."]
    if spec.dataset.eval is not None:
        every = f", every {t.eval_every} steps" if t.eval_every > 0 else ""
        out.append(f"The held-out rows' NLL is measured before training{every} and at the end"
                   + ("; the reward rules score one sample per held-out row (eval/correct) and per row of as many "
                      "training rows (eval/train_correct) at the same points."
                      if spec.reward is not None and spec.prompt is not None else "."))
    return out
