"""One DPO run (``method: dpo``): :func:`open_preference_run` builds a :class:`PreferenceRun`, which the script's
``main(run)`` drives (``compiler/templates/dpo.py.j2``: batch of pairs -> reference logprobs ->
forward_backward_custom(DPO loss) -> optim_step -> metrics -> checkpoint).

It is the supervised run (:class:`~sailrl.runtime.supervised.run.SupervisedRun`: opening, step order, records,
checkpoints, resume) with pairs in place of conversations:

- ``run.rows_for(step)``: ``dpo.batch_size`` rows in the seeded data order; ``run.pairs(rows)``: their datums,
  ``[chosen_1, rejected_1, ...]`` (:func:`~sailrl.runtime.preference.pairs.pair_datums`);
- ``run.reference_logprobs(step, rows, data)``: the frozen reference's (chosen, rejected) sequence logprobs of
  each pair, computed the first time a pair is drawn and kept (:class:`~sailrl.runtime.preference.pairs.Reference`).
  The reference is the starting weights: the base model, or ``training.init_from``'s weights through a second
  client loaded from them (as tinker_cookbook's DPO recipe takes a sampling client of the weights it starts from);
  a resumed run opens the same reference again, never its own trained weights;
- ``run.evaluate(step)``: the held-out pairs (``dataset.eval``): their DPO loss, accuracy and margin under the
  current weights (a forward pass, no update), and :data:`EVAL_SAMPLES` samples per held-out prompt compared with
  its two completions (``eval/chosen_rate``, ``eval/rejected_rate``: the fraction whose text, stripped, is the
  chosen / the rejected one); step 0 (the starting weights) goes into step 1's line with ``_start`` names.

A row whose pair cannot train (a completion missing or empty, chosen and rejected the same text) is skipped at
load and said so; ``sailrl validate`` reports such rows among the first data rows at their line.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import tinker
import torch

from sailrl.runtime.data import load_rows
from sailrl.runtime.loop import opening
from sailrl.runtime.loop.console import RunConsole
from sailrl.runtime.planning.cost import CostModel
from sailrl.runtime.preference.loss import dpo_loss, sequence_logprob
from sailrl.runtime.preference.pairs import Reference, pair_datums
from sailrl.runtime.preference.records import PreferenceRecords
from sailrl.runtime.prompts import PromptBuilder, PromptError
from sailrl.runtime.prompts.pairs import pair_problem, reply_text
from sailrl.runtime.rollouts.rollout import completion_text
from sailrl.runtime.run import RunOptions
from sailrl.runtime.rundir.directory import RunDirectory, run_dir_path
from sailrl.runtime.supervised.checkpoints import SupervisedCheckpoints
from sailrl.runtime.supervised.datums import ContextBound
from sailrl.runtime.supervised.run import SupervisedRun
from sailrl.spec.models import context_window
from sailrl.spec.schema import Spec

__all__ = ["EVAL_SAMPLES", "PreferenceRun", "open_preference_run", "open_reference"]

#: Samples drawn per held-out prompt at each evaluation (``eval/chosen_rate``).
EVAL_SAMPLES = 8


@dataclass
class PreferenceRun(SupervisedRun):
    """One DPO run (module docstring): the supervised run's parts, its ``records`` a
    :class:`~sailrl.runtime.preference.records.PreferenceRecords`, and ``reference``."""

    reference: Reference | None = None

    def rows_for(self, step: int, batch_size: int | None = None) -> list[dict[str, Any]]:
        """Step ``step``'s rows (``dpo.batch_size`` pairs), in the seeded data order, epoch after epoch."""
        return super().rows_for(step, batch_size or self.spec.dpo.batch_size)

    def pairs(self, rows: list[dict[str, Any]]) -> list[tinker.Datum]:
        """The rows' datums laid out as pairs: ``[chosen_1, rejected_1, chosen_2, rejected_2, ...]``."""
        return [d for row in rows for d in pair_datums(self.spec, self.prompts, row, self.max_length)]

    async def reference_logprobs(self, step: int, rows: list[dict[str, Any]],
                                 data: list[tinker.Datum]) -> list[tuple[float, float]]:
        """The reference model's (chosen, rejected) sequence logprobs of each row's pair (each pair computed once;
        the tokens read count as step ``step``'s ``tokens/reference``)."""
        values, read = await self.reference.logprobs(rows, data)
        self.records.tokens(step, "reference", read)
        return values

    async def evaluate(self, step: int) -> None:
        """The held-out pairs' DPO metrics and sampled chosen rate under the current weights, into step ``step``'s
        line (step 0: the starting weights, in step 1's line with ``_start`` names). No held-out rows: nothing."""
        rows = self.rows.eval
        if not rows:
            return
        data = self.pairs(rows)
        reference = await self.reference_logprobs(max(step, 1), rows, data)
        output = await (await self.training_client.forward_async(data, loss_fn="cross_entropy")).result_async()
        seq = [sequence_logprob(o["logprobs"].to_torch(), d.loss_fn_inputs["weights"].to_torch())
               for o, d in zip(output.loss_fn_outputs, data, strict=True)]
        ref = torch.tensor(reference, dtype=torch.float64)
        _, dpo = dpo_loss(torch.stack(seq[0::2]), torch.stack(seq[1::2]), ref[:, 0], ref[:, 1], self.spec.dpo.beta)
        metrics = {f"eval/{k.removeprefix('dpo/')}": v for k, v in dpo.items()}
        metrics.update(await self.eval_samples(rows, step))
        self.records.tokens(max(step, 1), "eval_prompt", sum(d.model_input.length for d in data))
        if step == 0:
            metrics = {f"{k}_start": v for k, v in metrics.items()}
        self.records.add(max(step, 1), metrics)

    async def eval_samples(self, rows: list[dict[str, Any]], step: int) -> dict[str, float]:
        """:data:`EVAL_SAMPLES` completions per held-out prompt from the current weights (``sampling.temperature``
        / ``top_p`` / ``max_tokens``, seeded), each compared with the row's chosen and rejected completion."""
        s, d = self.spec.sampling, self.spec.dpo
        policy = await self.training_client.save_weights_and_get_sampling_client_async(
            f"{self.spec.name}-eval-{step:06d}")
        stop = self.prompts.stop_sequences()

        async def one(i: int, row: dict[str, Any]) -> tuple[int, int]:
            params = tinker.SamplingParams(stop=stop, max_tokens=s.max_tokens, temperature=s.temperature,
                                           top_p=s.top_p, seed=self.spec.model.seed + i)
            result = await policy.sample_async(prompt=self.prompts.model_input(row), num_samples=EVAL_SAMPLES,
                                               sampling_params=params)
            texts = [completion_text(self.renderer, list(q.tokens), stop)[0].strip() for q in result.sequences]
            chosen, rejected = reply_text(row, d.chosen_field).strip(), reply_text(row, d.rejected_field).strip()
            return sum(t == chosen for t in texts), sum(t == rejected for t in texts)

        counts = await asyncio.gather(*(one(i, row) for i, row in enumerate(rows)))
        n = EVAL_SAMPLES * len(rows)
        return {"eval/chosen_rate": sum(c for c, _ in counts) / n, "eval/rejected_rate": sum(r for _, r in counts) / n}


async def open_reference(backend: Any, spec: Spec, init: Any) -> Reference:
    """The frozen reference: a sampling client of the base model, or (``training.init_from``) of a second training
    client loaded from the same weights."""
    service = backend.service_client
    if init is None:
        return Reference(await service.create_sampling_client_async(base_model=spec.model.name))
    frozen = await service.create_training_client_from_state_async(init.state_path)
    return Reference(await frozen.save_weights_and_get_sampling_client_async(f"{spec.name}-reference"))


def _row_check(spec: Spec, prompts: PromptBuilder, max_length: int | None) -> Any:
    """``row -> reason | None``: a row that cannot be a pair is skipped with the reason. ``max_length``: the
    model's context window; each of a pair's sequences (prompt and completion) must fit it with a token to spare,
    as the reference scores it whole (``compute_logprobs`` samples a token after it) and a completion cut short
    would compare parts of replies."""
    def check(row: dict[str, Any]) -> str | None:
        problem = pair_problem(row, spec.dpo.chosen_field, spec.dpo.rejected_field)
        if problem is not None:
            return problem
        try:
            prompts.messages(row)
        except PromptError as exc:
            return str(exc).removeprefix(f"row {row.get('_index')}: ")
        if max_length is not None and not all(bound.surely_fits([*prompts.conversation(row), {
                "role": "assistant", "content": reply_text(row, field)}]) for field in fields):
            for field, datum in zip(fields, pair_datums(spec, prompts, row), strict=True):
                n = datum.model_input.length + 1  # the whole sequence: the inputs and the last target
                if n >= max_length:
                    return (f"its prompt with the {field!r} completion is {n:,} tokens; the model's context is "
                            f"{max_length:,} and a pair is scored whole with a token to spare, so at most "
                            f"{max_length - 1:,}")
        return None

    fields = (spec.dpo.chosen_field, spec.dpo.rejected_field)
    bound = ContextBound(prompts.renderer, (max_length or 0) - 1)  # the whole sequence, with a token to spare
    return check


async def open_preference_run(spec: Spec, options: RunOptions) -> PreferenceRun:
    """Open the backend, model, reference, data and training client, then the run directory (the supervised run's
    order: nothing is written before everything opened). Raises the user errors ``open_supervised_run`` raises."""
    console = RunConsole(soft_wrap=True)
    run_dir = RunDirectory(run_dir_path(spec, options.spec_dir))
    start = opening.resume_point(run_dir, spec, resume=options.resume, overwrite=options.overwrite,
                                 spec_sha256=options.spec_sha256, console=console)
    resume_path = start.state_path or spec.training.resume_from
    init = opening.init_weights(spec, options.spec_dir)  # the reference's weights, resumed or not
    backend = await opening.connect(spec, spec_path=options.spec_path, spec_dir=options.spec_dir, console=console)
    training_client, _ = await opening.open_training_client(backend, spec, resume_path, console,
                                                            init=None if resume_path else init)
    reference = await open_reference(backend, spec, init)
    tokenizer, renderer = opening.tokenizer_and_renderer(spec, backend, training_client, options.spec_dir)
    prompts = PromptBuilder(spec.prompt, renderer)
    max_length = context_window(spec.model.name, options.spec_dir)[0]
    rows = load_rows(spec, options.spec_dir, renderer_check=_row_check(spec, prompts, max_length))
    if rows.skipped:
        console.print(f"[yellow]skipped {len(rows.skipped)} dataset rows (first: row {rows.skipped[0].index}: "
                      f"{rows.skipped[0].reason}); see `sailrl preflight` for all[/yellow]")
    # Everything opened: now the run directory is written.
    opening.write_run_dir(run_dir, spec, start, resume=options.resume, overwrite=options.overwrite,
                          spec_sha256=options.spec_sha256, spec_path=options.spec_path,
                          overrides=options.overrides, script_text=options.script_text, is_local=backend.is_local,
                          init=None if resume_path else init)
    records = PreferenceRecords(spec=spec, run_dir=run_dir, console=console, cost=CostModel.from_spec(spec),
                                completed=start.completed, is_local=backend.is_local)
    checkpoints = SupervisedCheckpoints(spec=spec, training_client=training_client, run_dir=run_dir,
                                        records=records, start_step=start.completed + 1,
                                        resume_command=options.resume_command)
    run = PreferenceRun(spec=spec, backend=backend, training_client=training_client, tokenizer=tokenizer,
                        renderer=renderer, rows=rows, prompts=prompts, reward_fn=None,
                        max_length=max_length, run_dir=run_dir,
                        records=records, checkpoints=checkpoints, console=console, start_step=start.completed + 1,
                        finished=start.finished, reference=reference)
    if resume_path:
        console.print(f"resuming from {resume_path} at step {start.completed + 1} ({start.completed} of "
                      f"{spec.training.steps} steps done)")
    return run
