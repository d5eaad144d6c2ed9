"""``method: sft``: the conversations of the first rows of a local dataset file have something to train on.

- ``sft.messages_field`` must be a declared dataset field, and its value on the data rows a list of ``{role,
  content}`` messages with an assistant turn (S260); an assistant message with no text is S259.
- With it, ``sft.completion`` is not read (W105).
- Without it, ``sft.completion`` (default: the reference answer) rendered on the data rows must not be empty
  (S259): such a row would be skipped by the run, and every row like it leaves nothing to train.

Each problem is reported once, for the first row that has it, at the key that makes the conversation.
"""

from __future__ import annotations

import time

from sailrl.compiler.checks.reader import SpecReader
from sailrl.compiler.checks.templates_on_data import DATA_RENDER_BUDGET_S, data_rows
from sailrl.runtime.prompts import PromptError, render_template
from sailrl.runtime.prompts.conversations import messages_problem

CODES = {"empty": "S259", "messages": "S260"}


def check_sft(spec: SpecReader) -> None:
    if spec.get(("method",)) != "sft":
        return
    field = spec.text(("sft", "messages_field"))
    if field is not None:
        if spec.get(("sft", "completion")) is not None:
            spec.warn(("sft", "completion"), "W105", f"sft.completion is not read: sft.messages_field {field!r} holds "
                      "each row's whole conversation, its assistant messages the replies that train",
                      "Remove sft.completion, or remove sft.messages_field to build each conversation from prompt: "
                      "and sft.completion.")
        _check_messages(spec, field)
    else:
        _check_completion(spec)


def _check_messages(spec: SpecReader, field: str) -> None:
    path = ("sft", "messages_field")
    declared = spec.declared_fields()
    if declared is not None and field not in declared:
        spec.add(path, "S260", f"sft.messages_field {field!r} is not a declared dataset field (dataset.fields: "
                 f"{', '.join(declared) or 'none'})", f"Add {field} to dataset.fields, or name the field that holds "
                 "each row's conversation (a list of {role, content} messages).")
        return
    for row in data_rows(spec):
        if field not in row:
            continue  # a row without the field is skipped by the run, and said so
        problem = messages_problem(row[field])
        if problem is not None:
            kind, what = problem
            spec.add(path, CODES[kind], f"on dataset row {row['_index']}, {field} {what}",
                     "Each row's field must hold its conversation as a list of {role, content} messages (roles "
                     "system, user, assistant) with at least one assistant message that has text; SFT trains the "
                     "assistant messages.")
            return


def _check_completion(spec: SpecReader) -> None:
    written = spec.text(("sft", "completion"))
    reference = spec.text(("prompt", "reference_field")) or "answer"
    template = written if written is not None else "{{ " + reference + " }}"
    path = ("sft", "completion") if written is not None else ("prompt", "reference_field") \
        if spec.text(("prompt", "reference_field")) is not None else ("method",)
    deadline = time.monotonic() + DATA_RENDER_BUDGET_S
    for row in data_rows(spec):
        if time.monotonic() > deadline:
            return
        try:
            reply = render_template(template, row, template="sft.completion")
        except PromptError:
            continue  # a missing field or a failing template: the templates' checks and the run say so
        if not reply.strip():
            what = "sft.completion" if written is not None else f"the reference answer ({reference}, the default " \
                                                                "sft.completion)"
            spec.add(path, "S259", f"{what} renders to an empty reply on dataset row {row['_index']}, so that row "
                     "has nothing to train on", "Set sft.completion to a template that gives each row's "
                     "assistant reply (e.g. '{{ answer }}'), or drop the rows whose reply is empty.")
            return
