"""One supervised run (``method: sft``): :func:`open_supervised_run` builds a :class:`SupervisedRun`, which the
script's ``main(run)`` drives (``compiler/templates/sft.py.j2``: batch of conversations -> datums ->
forward_backward(cross_entropy) -> optim_step -> eval NLL -> checkpoint).

Opening takes the RL run's steps (:mod:`sailrl.runtime.loop.opening`): ``resume_point`` (nothing written),
``connect``, ``open_training_client`` (``--resume`` state > ``training.resume_from`` > ``training.init_from`` > a
fresh LoRA), the tokenizer and renderer, the rows (each row's conversation checked: a row with no assistant text
is skipped and said so), and only then ``write_run_dir``.

What the script calls (the API another fixed-data method reuses):

- ``run.steps()``: the steps still to run (1-based, a progress bar); ``run.rows_for(step)``: the step's rows in
  the seeded data order (``sft.batch_size`` a step, epoch after epoch: ``runtime.data.rows_for_step``);
- ``run.datum(row)``: the row's conversation as a ``cross_entropy`` datum (:mod:`.datums`);
- ``run.evaluate(step)``: the held-out NLL (a forward pass, no update) and, when the spec has reward rules, one
  sample per held-out row scored by them (``eval/correct``, ``eval/reward``) and one per row of a fixed sample of
  as many training rows (``eval/train_correct``, ``eval/train_reward``: what the demonstrations taught, beside
  what carried over to rows never trained on); step 0 evaluates the starting weights (logged in step 1's line as
  ``eval/nll_start``, ``eval/correct_start``, ...);
- ``run.records`` (:class:`~sailrl.runtime.supervised.records.StepRecords`), ``run.checkpoints``
  (:class:`~sailrl.runtime.supervised.checkpoints.SupervisedCheckpoints`), ``run.due(every, step)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import tinker
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from tinker_cookbook.renderers import TrainOnWhat

from sailrl.runtime.backends.backend import Backend
from sailrl.runtime.backends.chat_template import ChatTemplateRenderer
from sailrl.runtime.data import DatasetRows, load_rows, rows_for_step, shuffle_seed
from sailrl.runtime.loop import opening
from sailrl.runtime.loop.console import RunConsole
from sailrl.runtime.planning.cost import CostModel
from sailrl.runtime.prompts import PromptBuilder, PromptError
from sailrl.runtime.prompts.conversations import ConversationError, conversation
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.runtime.rollouts.rollout import completion_text
from sailrl.runtime.run import RunOptions
from sailrl.runtime.rundir.directory import RunDirectory, run_dir_path
from sailrl.runtime.supervised.checkpoints import SupervisedCheckpoints
from sailrl.runtime.supervised.datums import ContextBound, conversation_datum, mean_nll, train_on, trained_tokens
from sailrl.runtime.supervised.records import StepRecords
from sailrl.spec.errors import ConfigError
from sailrl.spec.models import context_window
from sailrl.spec.schema import Spec, every_due

__all__ = ["SupervisedRun", "open_supervised_run"]


@dataclass
class SupervisedRun:
    """One supervised run (module docstring). ``start_step``: the first step still to run; ``finished``: every
    step was done before this start (only the final save is missing)."""

    spec: Spec
    backend: Backend
    training_client: Any
    tokenizer: Any
    renderer: Any
    rows: DatasetRows
    prompts: PromptBuilder | None
    reward_fn: RewardFunction | None
    max_length: int | None
    run_dir: RunDirectory
    records: StepRecords
    checkpoints: SupervisedCheckpoints
    console: Console
    start_step: int
    finished: bool = False

    @property
    def completed(self) -> int:
        return self.records.completed

    def steps(self) -> Iterator[int]:
        """The steps still to run (1-based), with a progress bar; each step's clock starts as it is yielded."""
        total = self.spec.training.steps
        columns = (TextColumn(f"[bold]{self.spec.method.upper()}[/bold]"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())
        with Progress(*columns, console=self.console, transient=True) as progress:
            task = progress.add_task("", total=total, completed=self.completed)
            for step in range(self.start_step, total + 1):
                self.records.start(step)
                yield step
                progress.update(task, completed=self.completed)

    def rows_for(self, step: int, batch_size: int | None = None) -> list[dict[str, Any]]:
        """Step ``step``'s rows (``batch_size``, default ``sft.batch_size``), in the seeded data order."""
        n = batch_size or self.spec.sft.batch_size
        return rows_for_step(self.rows.train, step - 1, n, shuffle_seed(self.spec), reshuffle=self.spec.dataset.shuffle)

    def conversation(self, row: dict[str, Any]) -> list[dict[str, str]]:
        """The row's conversation (:func:`~sailrl.runtime.prompts.conversations.conversation`)."""
        return conversation(row, self.spec, self.prompts)

    def datum(self, row: dict[str, Any]) -> tinker.Datum:
        """The row's conversation as a ``cross_entropy`` datum: weights on the assistant turns only."""
        return conversation_datum(self.conversation(row), self.renderer, self.max_length)

    @staticmethod
    def due(every: int, step: int) -> bool:
        return every_due(every, step)

    async def evaluate(self, step: int) -> None:
        """Held-out NLL (and, with reward rules, scored samples of the held-out rows and of :meth:`train_sample`)
        of the current weights, into step ``step``'s line; step 0 (the starting weights) goes into step 1's line
        with ``_start`` names. No held-out rows: nothing."""
        if not self.rows.eval:
            return
        metrics = {"eval/nll": await self.eval_nll(self.rows.eval)}
        if self.reward_fn is not None:
            policy = await self.training_client.save_weights_and_get_sampling_client_async(
                f"{self.spec.name}-eval-{step:06d}")
            metrics.update(await self.scored_samples(policy, self.rows.eval, "eval/"))
            metrics.update(await self.scored_samples(policy, self.train_sample(), "eval/train_"))
        if step == 0:
            metrics = {f"{k}_start": v for k, v in metrics.items()}
        self.records.add(max(step, 1), metrics)

    async def eval_nll(self, rows: list[dict[str, Any]]) -> float:
        """The mean NLL of ``rows``' assistant tokens under the current weights (a forward pass, no update)."""
        data = [self.datum(row) for row in rows]
        output = await (await self.training_client.forward_async(data, loss_fn="cross_entropy")).result_async()
        return mean_nll([o["logprobs"] for o in output.loss_fn_outputs], data)

    def train_sample(self) -> list[dict[str, Any]]:
        """The training rows the evaluation also samples: the first ``len(rows.eval)`` in load order (a seeded
        sample when ``dataset.shuffle`` is on), the same rows at every evaluation, as many as are held out so the
        two fractions are measured alike."""
        return self.rows.train[:len(self.rows.eval)]

    async def scored_samples(self, policy: Any, rows: list[dict[str, Any]], prefix: str) -> dict[str, float]:
        """One completion per row from ``policy`` (``sampling.temperature`` / ``top_p`` / ``max_tokens``, row
        ``i`` seeded ``model.seed + i``), scored by the reward rules: ``<prefix>reward`` (the mean total) and
        ``<prefix>correct`` (the fraction of rows whose correct rule passed; left out when no rule says). No rows:
        nothing."""
        if not rows:
            return {}
        s = self.spec.sampling
        stop = self.prompts.stop_sequences()
        seed = self.spec.model.seed

        async def one(i: int, row: dict[str, Any]) -> Any:
            params = tinker.SamplingParams(stop=stop, max_tokens=s.max_tokens, temperature=s.temperature,
                                           top_p=s.top_p, seed=seed + i)
            result = await policy.sample_async(prompt=self.prompts.model_input(row), num_samples=1,
                                               sampling_params=params)
            text, clean = completion_text(self.renderer, list(result.sequences[0].tokens), stop)
            return self.reward_fn.score(text, row, truncated=not clean)

        scores = await asyncio.gather(*(one(i, row) for i, row in enumerate(rows)))
        out = {f"{prefix}reward": sum(sc.total for sc in scores) / len(scores)}
        correct = [float(sc.correct) for sc in scores if sc.correct is not None]
        if correct:
            out[f"{prefix}correct"] = sum(correct) / len(correct)
        return out

    async def close(self) -> None:
        """Release the local backend's worker threads."""
        if self.backend.is_local:
            await asyncio.to_thread(self.backend.service_client.close, "done")


def _row_check(spec: Spec, prompts: PromptBuilder | None, renderer: Any, max_length: int | None) -> Any:
    """``row -> reason | None``: a row whose conversation cannot be trained on is skipped with the reason: no
    assistant text, or (``max_length``: the model's context window) no assistant token within the context, where
    the datum is cut and its weights would all be 0."""
    def check(row: dict[str, Any]) -> str | None:
        try:
            messages = conversation(row, spec, prompts)
        except (ConversationError, PromptError) as exc:
            return str(exc).removeprefix(f"row {row.get('_index')}: ")
        if isinstance(renderer, ChatTemplateRenderer) and train_on(messages) is not TrainOnWhat.LAST_ASSISTANT_MESSAGE:
            turns = sum(1 for m in messages if m["role"] == "assistant")
            return (f"it has {turns} assistant messages or does not end with one, and the chat_template renderer "
                    "(the model's own template) trains only a conversation that ends in its one assistant message: "
                    "set model.renderer to one that trains every turn (role_colon works with any tokenizer)")
        if max_length is not None and not bound.surely_fits(messages) \
                and not trained_tokens([conversation_datum(messages, renderer, max_length)]):
            return (f"its assistant turns begin after the model's context of {max_length:,} tokens, so nothing "
                    "of them would be trained")
        return None

    bound = ContextBound(renderer, max_length or 0)
    return check


async def open_supervised_run(spec: Spec, options: RunOptions) -> SupervisedRun:
    """Open the backend, model, data and training client, then the run directory (module docstring). Raises
    ``RunDirectoryError`` / ``BackendError`` / ``ModelError`` / ``DataError`` / ``ConfigError`` (user errors)."""
    console = RunConsole(soft_wrap=True)
    run_dir = RunDirectory(run_dir_path(spec, options.spec_dir))
    start = opening.resume_point(run_dir, spec, resume=options.resume, overwrite=options.overwrite,
                                 spec_sha256=options.spec_sha256, console=console)
    resume_path = start.state_path or spec.training.resume_from
    init = None if resume_path else opening.init_weights(spec, options.spec_dir)  # an earlier run's final state
    backend = await opening.connect(spec, spec_path=options.spec_path, spec_dir=options.spec_dir, console=console)
    training_client, _ = await opening.open_training_client(backend, spec, resume_path, console, init=init)
    tokenizer, renderer = opening.tokenizer_and_renderer(spec, backend, training_client, options.spec_dir)
    prompts = PromptBuilder(spec.prompt, renderer) if spec.prompt is not None else None
    reward_fn = None
    if spec.reward is not None and prompts is not None:  # the rules score samples of the prompt's reply
        reward_fn = RewardFunction.from_spec(spec.reward, reference_field=spec.prompt.reference_field,
                                             spec_dir=options.spec_dir)
        if reward_fn.judges:
            raise ConfigError("method sft scores its held-out samples with rules that need no judge model: remove "
                              "the kind: judge rules from reward:, or score the trained adapter with an RL spec")
    max_length = context_window(spec.model.name, options.spec_dir)[0]
    rows = load_rows(spec, options.spec_dir, renderer_check=_row_check(spec, prompts, renderer, max_length))
    if rows.skipped:
        console.print(f"[yellow]skipped {len(rows.skipped)} dataset rows (first: row {rows.skipped[0].index}: "
                      f"{rows.skipped[0].reason}); see `sailrl preflight` for all[/yellow]")
    # Everything opened: now the run directory is written.
    opening.write_run_dir(run_dir, spec, start, resume=options.resume, overwrite=options.overwrite,
                          spec_sha256=options.spec_sha256, spec_path=options.spec_path,
                          overrides=options.overrides, script_text=options.script_text, is_local=backend.is_local,
                          init=init)
    records = StepRecords(spec=spec, run_dir=run_dir, console=console, cost=CostModel.from_spec(spec),
                          completed=start.completed, is_local=backend.is_local)
    checkpoints = SupervisedCheckpoints(spec=spec, training_client=training_client, run_dir=run_dir,
                                        records=records, start_step=start.completed + 1,
                                        resume_command=options.resume_command)
    run = SupervisedRun(spec=spec, backend=backend, training_client=training_client, tokenizer=tokenizer,
                        renderer=renderer, rows=rows, prompts=prompts, reward_fn=reward_fn,
                        max_length=max_length, run_dir=run_dir,
                        records=records, checkpoints=checkpoints, console=console, start_step=start.completed + 1,
                        finished=start.finished)
    if resume_path:
        console.print(f"resuming from {resume_path} at step {start.completed + 1} ({start.completed} of "
                      f"{spec.training.steps} steps done)")
    return run
