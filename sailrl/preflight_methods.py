"""``sailrl preflight`` for the methods that sample nothing to train: ``method: sft`` (conversations) and ``method:
dpo`` (preference pairs). Other methods get :func:`sailrl.preflight.build_report`'s report; :func:`report_for`
picks.

The report has the keys ``build_report``'s has, so the command prints it and the studio shows it the same way:
``data`` (rows loaded and skipped with the reason the run skips them: a conversation with nothing to train on, a
row that is no pair), ``prompts`` (the first rows as the model reads them: an SFT row's whole conversation with
its trained tokens, a DPO row's prompt with the chosen and the rejected reply; each entry's ``label`` says which),
``tokens`` (the datums' lengths, ``what`` names them, against the context window), ``reward`` (SFT's optional rules
that score held-out samples; DPO has none and says so), ``cost`` (:func:`~sailrl.runtime.planning.cost.
estimate_supervised` / :func:`~sailrl.runtime.planning.cost.estimate_preference` on the measured lengths), and
``--sample``'s answer: these methods train on their data, so the note says what the run samples instead.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sailrl.preflight import (
    _decode,
    _load_text_tools,
    _messages_text,
    _problem,
    _skipped_section,
    _warning_short,
    build_report,
)
from sailrl.preflight import _finish as finish_report
from sailrl.runtime.data import DatasetError, load_rows, rows_for_step, shuffle_seed
from sailrl.runtime.data.method_rows import row_check
from sailrl.runtime.planning.cost import estimate_preference, estimate_supervised, fmt_usd
from sailrl.runtime.preference.pairs import pair_datums
from sailrl.runtime.prompts import PromptBuilder
from sailrl.runtime.prompts.conversations import conversation
from sailrl.runtime.prompts.pairs import reply_text
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.runtime.supervised.datums import conversation_datum, trained_tokens
from sailrl.spec.models import context_window
from sailrl.spec.schema import Spec

__all__ = ["SAMPLE_NOTES", "build_method_report", "report_for"]

#: What ``--sample`` says for a method that samples nothing to train.
SAMPLE_NOTES = {
    "sft": ("--sample: an SFT run samples nothing to train on (the conversations are the data); with reward rules "
            "it scores one sample per held-out row at each evaluation (eval/correct). Nothing was sampled here: "
            "the conversations above are what it trains on."),
    "dpo": ("--sample: a DPO run samples nothing to train on and has no reward rules to score samples with (the "
            "pairs are the data); at each evaluation it samples the held-out prompts and counts how often a sample "
            "writes the chosen reply (eval/chosen_rate). Nothing was sampled here: the pairs above are what it "
            "trains on."),
}


def report_for(spec: Spec, spec_dir: Path | str, **options: Any) -> dict[str, Any]:
    """The preflight report of ``spec``: :func:`build_method_report` for SFT and DPO, else ``build_report``
    (``options``: ``build_report``'s keywords)."""
    if spec.method in SAMPLE_NOTES:
        keep = ("sample", "show", "spec_path", "loaded", "max_rows_measured", "spec_warnings")
        return build_method_report(spec, spec_dir, **{k: v for k, v in options.items() if k in keep})
    return build_report(spec, spec_dir, **options)


def _full_text(tokenizer: Any, datum: Any) -> str:
    """The datum's whole sequence (its inputs and the last target token) as text."""
    return _decode(tokenizer, [*datum.model_input.to_ints(), int(datum.loss_fn_inputs["target_tokens"].tolist()[-1])])


class _Rows:
    """The datums of a method's rows: ``length(row)`` (tokens sent per row: a conversation, or a pair's chosen plus
    rejected) and ``shown(row)`` (the entry of ``report["prompts"]``)."""

    def __init__(self, spec: Spec, tokenizer: Any, renderer: Any) -> None:
        self.spec, self.tokenizer, self.renderer = spec, tokenizer, renderer
        self.prompts = PromptBuilder(spec.prompt, renderer) if spec.prompt is not None else None

    def datums(self, row: dict[str, Any]) -> list[Any]:
        if self.spec.method == "dpo":
            return list(pair_datums(self.spec, self.prompts, row))
        return [conversation_datum(conversation(row, self.spec, self.prompts), self.renderer)]

    def length(self, row: dict[str, Any]) -> int:
        return sum(d.model_input.length for d in self.datums(row))

    def shown(self, row: dict[str, Any]) -> dict[str, Any]:
        data = self.datums(row)
        if self.spec.method == "dpo":
            chosen, rejected = data
            prompt = _decode(self.tokenizer, self.prompts.model_input(row).to_ints())
            d = self.spec.dpo
            text = (f"{prompt}\n── chosen ({d.chosen_field}) ──\n{reply_text(row, d.chosen_field)}\n"
                    f"── rejected ({d.rejected_field}) ──\n{reply_text(row, d.rejected_field)}")
            return {"index": row["_index"], "label": "pair", "text": text,
                    "tokens": chosen.model_input.length + rejected.model_input.length,
                    "subtitle": f"chosen {chosen.model_input.length} + rejected {rejected.model_input.length} "
                                f"tokens; trained: {trained_tokens([chosen])} + {trained_tokens([rejected])}"}
        (datum,) = data
        return {"index": row["_index"], "label": "conversation", "text": _full_text(self.tokenizer, datum),
                "tokens": datum.model_input.length,
                "subtitle": f"trained: {trained_tokens([datum])} assistant tokens (weight 0 on the rest)"}


def _replies_cut(spec: Spec, measure: _Rows, evals: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A warning when held-out replies (with the end-of-turn that ends them) are longer than
    ``sampling.max_tokens``: the evaluation's samples of those rows are cut off before they can end. The replies
    are the rows' own (an SFT row's one reply, a DPO row's chosen one); an SFT spec without reward rules samples
    nothing, and a conversation of several assistant turns is not one reply."""
    if spec.method == "sft" and (spec.reward is None or spec.sft is None or spec.sft.messages_field is not None):
        return None
    lengths = [trained_tokens(measure.datums(row)[:1]) for row in evals]
    max_tokens = spec.sampling.max_tokens
    longer = [n for n in lengths if n > max_tokens]
    if not longer:
        return None
    what = "chosen replies" if spec.method == "dpo" else "replies"
    return _problem("warning", f"{len(longer)} of {len(lengths)} held-out {what}, with the end-of-turn that closes "
                    f"them, are longer than sampling.max_tokens ({max_tokens}; the longest is {max(longer)} tokens): "
                    "the evaluation's samples of those rows are cut off before they can end as the reply does",
                    f"set sampling.max_tokens: {max(longer)} or more", f"held-out {what} longer than max_tokens")


def _text_only(spec: Spec, row: dict[str, Any]) -> dict[str, Any]:
    """A row shown as its messages' text, when the tokenizer could not be loaded."""
    prompts = PromptBuilder(spec.prompt, None, field_names=None) if spec.prompt is not None else None
    if spec.method == "dpo":
        d = spec.dpo
        text = (f"{_messages_text(prompts.messages(row))}\n── chosen ──\n{reply_text(row, d.chosen_field)}\n"
                f"── rejected ──\n{reply_text(row, d.rejected_field)}")
        return {"index": row["_index"], "label": "pair", "text": text, "tokens": None,
                "subtitle": "token lengths unknown (no tokenizer)"}
    return {"index": row["_index"], "label": "conversation", "tokens": None,
            "subtitle": "token lengths unknown (no tokenizer)",
            "text": _messages_text(conversation(row, spec, prompts))}


def _reward_section(spec: Spec, spec_dir: Path) -> tuple[dict[str, Any], Any]:
    if spec.reward is not None and spec.prompt is not None:
        fn = RewardFunction.from_spec(spec.reward, spec.prompt.reference_field, spec_dir=spec_dir)
        low, high = fn.bounds()
        formula = ["these rules score one sample per held-out row at each evaluation (eval/reward, eval/correct); "
                   "the run trains on the conversations, not on the rules", *fn.explain(held_out=True)]
        return {"formula": formula, "min": low, "max": high, "constant": None}, fn
    words = {"sft": "no reward rules: the run trains on the conversations (cross_entropy on the assistant turns)",
             "dpo": "DPO has no reward rules: it trains each pair's chosen reply over its rejected one"}
    return {"formula": [words[spec.method]], "min": None, "max": None, "constant": None}, None


def _token_section(what: str, lengths: list[int], context: int | None, source: str) -> dict[str, Any]:
    over = sum(1 for n in lengths if context is not None and n > context)
    return {"what": what, "measured_rows": len(lengths), "min": min(lengths), "median": statistics.median(lengths),
            "max": max(lengths), "context": context, "context_source": source, "max_tokens": None,
            "max_prompt_tokens": context, "skipped_too_long": 0, "over_context": over}


def build_method_report(spec: Spec, spec_dir: Path | str, *, sample: int = 0, show: int = 3,
                        spec_path: str | None = None, loaded: Any = None, max_rows_measured: int = 5000,
                        spec_warnings: Sequence[Any] = ()) -> dict[str, Any]:
    """The preflight report of an SFT or DPO spec (module docstring). ``sample`` > 0 adds the note of what the run
    samples instead; the other arguments are ``build_report``'s."""
    spec_dir = Path(spec_dir)
    report: dict[str, Any] = {"spec": spec_path, "name": spec.name, "model": spec.model.name,
                              "method": spec.method, "sample": None}
    problems: list[dict[str, Any]] = []
    report["problems"] = problems
    for w in spec_warnings:
        where = f"{w.file}:{w.line}:{w.column}" if w.line else w.file
        problems.append(_problem("warning", f"{where}: {w.key_path}: {w.message}" if w.key_path else
                                 f"{where}: {w.message}", w.hint, _warning_short(w)))
    report["reward"], reward_fn = _reward_section(spec, spec_dir)
    tokenizer, renderer, tool_problem = _load_text_tools(spec, spec_dir)
    context, context_source = context_window(spec.model.name, spec_dir)
    prompts = PromptBuilder(spec.prompt, None) if spec.prompt is not None else None
    try:
        rows = load_rows(spec, spec_dir, renderer_check=row_check(spec, prompts))
    except DatasetError as exc:
        where = loaded.locate(exc.key) if (loaded is not None and exc.key) else None
        problems.append(_problem("error", str(exc), None))
        report["data"] = {"error": str(exc), "key": exc.key, "location": list(where) if where else None}
        return finish_report(report)
    train, evals = rows.train, rows.eval
    unit = "pairs" if spec.method == "dpo" else "conversations"
    report["data"] = {
        "source": rows.source, "columns": rows.columns, "loaded": rows.loaded, "selected": rows.selected,
        "train": len(train), "eval": len(evals), "skipped": _skipped_section(rows.skipped), "notes": rows.notes,
        "unit": unit,
    }
    for note in rows.notes:
        problems.append(_problem("warning", note))
    if rows.skipped:
        top = report["data"]["skipped"]["by_reason"][0]
        problems.append(_problem(
            "warning", f"{len(rows.skipped)} of {rows.selected} rows are skipped (most often: {top['reason']}, "
            f"{top['count']} rows, e.g. row {top['rows'][0]})", "fix those rows, or map the right columns",
            f"{len(rows.skipped)} of {rows.selected} rows skipped"))
    if spec.training.eval_every > 0 and not evals:
        problems.append(_problem("warning", "training.eval_every is set but there are no evaluation rows",
                                 "add dataset.eval (split, count or fraction)", "no evaluation rows"))
    first = rows_for_step(train, 0, min(max(show, 1), len(train)), shuffle_seed(spec),
                          reshuffle=spec.dataset.shuffle)[:show]
    lengths = eval_lengths = None
    if tool_problem is not None:
        problems.append(_problem("warning", tool_problem + f"; the {unit} are shown as text and token lengths are "
                                 "unknown", "run preflight where the model's tokenizer can be loaded",
                                 "tokenizer not loaded"))
        report["prompts"] = [_text_only(spec, r) for r in first]
        report["tokens"] = None
    else:
        measure = _Rows(spec, tokenizer, renderer)
        report["prompts"] = [measure.shown(r) for r in first]
        lengths = [measure.length(r) for r in train[:max_rows_measured]]
        eval_lengths = [measure.length(r) for r in evals[:max_rows_measured]]
        what = "pair tokens (chosen + rejected)" if spec.method == "dpo" else "conversation tokens"
        report["tokens"] = _token_section(what, lengths, context, context_source)
        over = report["tokens"]["over_context"]
        if over:
            problems.append(_problem("warning", f"{over} of {len(lengths)} training rows are longer than the "
                                     f"model's context ({context} tokens): the run cuts them there",
                                     "shorten those rows", f"{over} rows longer than the context"))
        cut = _replies_cut(spec, measure, evals[:max_rows_measured])
        if cut is not None:
            problems.append(cut)
    if reward_fn is not None:
        reward_fn.close_judges()
    if sample > 0:
        problems.append(_problem("note", SAMPLE_NOTES[spec.method]))
    report["cost"] = _cost_section(spec, lengths, eval_lengths, len(train))
    return finish_report(report)


def _cost_section(spec: Spec, lengths: list[int] | None, eval_lengths: list[int] | None,
                  train_rows: int) -> dict[str, Any]:
    measured = len(lengths or [])
    estimate = (estimate_preference if spec.method == "dpo" else estimate_supervised)(
        spec, lengths or None, eval_lengths if lengths is not None else None,
        train_rows=train_rows if measured and train_rows > measured else None)
    out = estimate.as_dict()
    tok = estimate.total_tokens()
    how = "measured" if lengths else "not measured"
    if estimate.total_usd is None:
        cost = ("unknown: add " + ", ".join(p.spec_key for p in estimate.missing_prices) + " (USD per million "
                "tokens) to the spec")
    elif estimate.sampler == "local":
        cost = "$0 (the embedded backend bills nothing)"
    else:
        usd = estimate.total_usd
        cost = (fmt_usd(usd.low) if fmt_usd(usd.low) == fmt_usd(usd.high)
                else f"{fmt_usd(usd.low)}-{fmt_usd(usd.high)}") + " (estimate)"
    low, high = f"{tok.low:,.0f}", f"{tok.high:,.0f}"
    what = "pair" if spec.method == "dpo" else "conversation"
    out["summary"] = f"tokens: {low if low == high else f'{low}-{high}'} ({what} lengths {how}); cost: {cost}"
    out["lines"] = estimate.render()
    return out
