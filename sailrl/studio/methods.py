"""What the studio shows for a spec's training method (``method: sft | dpo | distill``; RL is the page as it is).

- The Rules tab of a spec without reward rules: a method that has none says what it trains on instead of asking
  for rules (DPO may have none; SFT and distillation may leave them out) — :func:`rules_note`.
- The Data tab's row: an SFT row is a conversation (the prompt's messages and the reply, or the row's messages
  field), rendered whole with its trained tokens; a DPO row is a pair, its prompt with the chosen and the rejected
  reply and each one's tokens — :func:`method_row`. Rows are skipped for the reasons the run skips them
  (:func:`sailrl.runtime.data.method_rows.row_check`).
- The cache key of a spec's rows: the sections that change them (:func:`data_key_parts`).
- Starting a run: a page override of a key the method does not read is refused in one line
  (:func:`override_problem`), and the outcome of a run that logs no reward says how its own metric moved
  (:func:`method_outcome`).
"""

from __future__ import annotations

from typing import Any

from sailrl.runtime.data.method_rows import row_check
from sailrl.runtime.prompts import PromptBuilder, PromptError
from sailrl.runtime.prompts.conversations import ConversationError, conversation
from sailrl.runtime.prompts.pairs import reply_text
from sailrl.spec.methods import METHOD_KEYS
from sailrl.spec.schema import Spec

__all__ = ["METHOD_VIEWS", "data_key_parts", "method_outcome", "method_row", "override_problem", "row_check",
           "rules_note"]

#: The methods whose rows the Data tab shows as something other than a prompt.
METHOD_VIEWS = ("sft", "dpo")

_NO_RULES = {
    "dpo": "method dpo has no reward rules: it trains each row's chosen reply over its rejected one (the Data tab "
           "shows the pairs). Nothing here scores completions.",
    "sft": "method sft needs no reward rules: it trains on each row's conversation (the Data tab shows them). Rules "
           "you add score one sample per held-out row at each evaluation (eval/correct), not the loss.",
    "distill": "method distill needs no reward rules: the teacher's logprobs are the signal. Rules you add score the "
               "student's samples and add their group advantage to the teacher's.",
}


def rules_note(method: Any) -> str | None:
    """What the Rules tab says for a spec of ``method`` that has no ``reward:`` section (None for RL, which needs
    one)."""
    return _NO_RULES.get(method) if isinstance(method, str) else None


def data_key_parts(spec: Spec) -> list[Any]:
    """The parts of ``spec`` that change its rows or how a row is shown (with the method's section)."""
    def dump(part: Any) -> Any:
        return part.model_dump(mode="json") if part is not None else None

    return [spec.method, dump(spec.dataset), dump(spec.prompt), dump(spec.reward), dump(spec.model),
            spec.sampling.max_tokens, dump(spec.training.warmup), dump(spec.sft), dump(spec.dpo)]


def _decode(tokenizer: Any, tokens: list[int]) -> str:
    return str(tokenizer.decode(tokens))


def method_row(spec: Spec, row: dict[str, Any], tokenizer: Any, renderer: Any) -> dict[str, Any]:
    """The Data tab's view of ``row`` for an SFT or DPO spec: ``prompt`` (the text shown: the whole conversation,
    or the pair's prompt), ``tokens``, and ``conversation`` (the messages, ``trained_tokens``) or ``pair``
    (``prompt``, ``chosen``, ``rejected``, their fields and ``chosen_tokens`` / ``rejected_tokens``); a row that
    cannot be one gives ``prompt_error`` (the run's words). Without a tokenizer, token counts are None."""
    # lazy: the datums need torch and tinker (seconds); the studio opens without them
    from sailrl.runtime.preference.pairs import pair_datums
    from sailrl.runtime.supervised.datums import conversation_datum, trained_tokens  # lazy: see above

    prompts = PromptBuilder(spec.prompt, renderer) if spec.prompt is not None else None
    out: dict[str, Any] = {"method": spec.method}
    try:
        if spec.method == "dpo":
            d = spec.dpo
            pair = {"chosen_field": d.chosen_field, "rejected_field": d.rejected_field,
                    "chosen": reply_text(row, d.chosen_field), "rejected": reply_text(row, d.rejected_field),
                    "messages": prompts.messages(row), "chosen_tokens": None, "rejected_tokens": None}
            if renderer is not None:
                pair["prompt"] = _decode(tokenizer, prompts.model_input(row).to_ints())
                chosen, rejected = pair_datums(spec, prompts, row)
                pair["chosen_tokens"], pair["rejected_tokens"] = chosen.model_input.length, rejected.model_input.length
                out["tokens"] = chosen.model_input.length + rejected.model_input.length
            else:
                pair["prompt"] = "\n\n".join(f"{m['role']}: {m['content']}" for m in pair["messages"])
                out["tokens"] = None
            out["pair"] = pair
            out["prompt"] = pair["prompt"]
            return out
        messages = conversation(row, spec, prompts)
        out["conversation"] = messages
        if renderer is not None:
            datum = conversation_datum(messages, renderer)
            whole = [*datum.model_input.to_ints(), int(datum.loss_fn_inputs["target_tokens"].tolist()[-1])]
            out.update(prompt=_decode(tokenizer, whole), tokens=datum.model_input.length,
                       trained_tokens=trained_tokens([datum]))
        else:
            out.update(prompt="\n\n".join(f"{m['role']}: {m['content']}" for m in messages), tokens=None,
                       trained_tokens=None)
    except (ConversationError, PromptError) as exc:
        out["prompt_error"] = str(exc)
    return out


_BATCH = {"sft": "sft.batch_size conversations", "dpo": "dpo.batch_size pairs"}


def override_problem(spec: Spec, overrides: dict[str, float]) -> str | None:
    """Why the page cannot start ``spec``'s run with ``overrides`` (a key its method does not read), or None."""
    for key in overrides:
        methods = METHOD_KEYS.get(tuple(key.split(".")))
        if methods is not None and spec.method not in methods:
            per_step = f": a step trains {_BATCH[spec.method]}" if spec.method in _BATCH else ""
            return (f"{key} is not read by method {spec.method}{per_step}; leave it empty (or set the method's own "
                    "key in the spec)")
    return None


def _moved(metrics: list[dict[str, Any]], key: str, start_key: str | None = None) -> tuple[float, float] | None:
    values = [float(m[key]) for m in metrics if isinstance(m.get(key), (int, float)) and not isinstance(m[key], bool)]
    start = next((float(m[start_key]) for m in metrics if start_key and isinstance(m.get(start_key), (int, float))),
                 None)
    if not values or (start is None and len(values) < 2):
        return None
    return (start if start is not None else values[0]), values[-1]


def method_outcome(metrics: list[dict[str, Any]], method: str) -> str | None:
    """How the method's own metric moved over the run's steps, in words (None for RL or too few steps): SFT's
    held-out (else training) NLL, DPO's held-out (else training) accuracy, a distillation's reverse KL."""
    found = []
    if method == "sft":
        found = [("the held-out NLL", _moved(metrics, "eval/nll", "eval/nll_start"), ".3f"),
                 ("the training NLL", _moved(metrics, "train/nll"), ".3f")]
    elif method == "dpo":
        found = [("the held-out DPO accuracy", _moved(metrics, "eval/accuracy", "eval/accuracy_start"), ".0%"),
                 ("the DPO accuracy", _moved(metrics, "dpo/accuracy"), ".0%")]
    elif method == "distill":
        found = [("the reverse KL to the teacher", _moved(metrics, "distill/reverse_kl"), ".3f")]
    for what, moved, fmt in found:
        if moved is not None:
            return f"{what} went from {format(moved[0], fmt)} to {format(moved[1], fmt)}"
    return None
