"""The steps of :func:`sailrl.runtime.run.open_run`, in the order it takes them.

1. :func:`resume_point`: the run directory's policy (refuse to overwrite a run; what ``--resume`` continues from),
   nothing written.
2. :func:`connect`: keys, backend, and (remote) a bounded first request to Tinker.
3. :func:`open_training_client`: ``--resume`` state + optimizer > ``training.resume_from`` > ``training.init_from``
   weights (a checkpoint path, or an earlier run's directory: :func:`init_weights`, resolved before anything is
   written) > a fresh LoRA; the checkpoint's LoRA rank wins over the spec's.
4. :func:`load_inputs`: tokenizer, renderer, reward rules, dataset rows, prompts.
5. :func:`write_run_dir`: only now is anything written (``config.json``, ``train.py``, logs of steps to re-run
   dropped).

Every remote call is bounded in time (:func:`call_with_deadline`): an unreachable service is one line, never a
hang.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tinker
from rich.console import Console

from sailrl.runtime.backends.backend import Backend, BackendError, check_keys, open_backend
from sailrl.runtime.backends.judge_clients import connect_judges, judge_rules
from sailrl.runtime.backends.models import get_renderer, get_tokenizer
from sailrl.runtime.data import DatasetRows, load_rows
from sailrl.runtime.planning.cost import CostModel
from sailrl.runtime.prompts import PromptBuilder
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.runtime.rundir.checkpoint_store import note_run_directory
from sailrl.runtime.rundir.directory import CONFIG_FILE, WARMUP_FILE, RunDirectory
from sailrl.runtime.rundir.init_from import InitWeights, resolve_init_from
from sailrl.runtime.rundir.method_logs import run_method
from sailrl.runtime.rundir.writes import RunDirectoryError
from sailrl.spec.errors import ConfigError
from sailrl.spec.methods import METHOD_WORDS
from sailrl.spec.models import default_renderer
from sailrl.spec.rewards import RewardSpec
from sailrl.spec.schema import Spec
from sailrl.spec.version import __version__

__all__ = ["CONNECT_TIMEOUT_S", "CREATE_TIMEOUT_S", "Inputs", "ResumePoint", "call_with_deadline", "connect",
           "connect_timeout_s", "cost_model", "load_inputs", "open_training_client", "open_wandb", "resume_point",
           "tokenizer_and_renderer", "write_run_dir"]

#: Seconds Tinker gets to answer its first request (``SAILRL_CONNECT_TIMEOUT_S`` overrides) and to create a
#: training client (a large model can take minutes to place).
CONNECT_TIMEOUT_S = 30.0
CREATE_TIMEOUT_S = 900.0


@dataclass
class ResumePoint:
    """Where a run starts: the saved state it continues from (``None``: a new run), the RL steps done, and
    ``finished`` (every step done, only the final save missing)."""

    state: dict[str, Any] | None
    completed: int
    finished: bool

    @property
    def state_path(self) -> str | None:
        return (self.state or {}).get("state_path")


@dataclass
class Inputs:
    """What the loop reads from the model and the data: tokenizer, renderer, reward rules, rows, prompts."""

    tokenizer: Any
    renderer: Any
    reward_fn: RewardFunction
    rows: DatasetRows
    prompts: PromptBuilder


# ---------------------------------------------------------------- 1. resume
def resume_point(run_dir: RunDirectory, spec: Spec, *, resume: bool, overwrite: bool, spec_sha256: str,
                 console: Console) -> ResumePoint:
    """Check the run directory (nothing written) and find where the run starts. Raises
    :class:`RunDirectoryError` when a run is there and neither ``resume`` nor ``overwrite`` is set, or when the run
    is complete."""
    steps = spec.training.steps
    if not resume and run_dir.has_metrics() and not overwrite:
        done = len(run_dir.read_metrics())
        if run_dir.final_saved(done):
            raise RunDirectoryError(
                f"{run_dir.path} holds a finished run ({done} steps). Start it over with --overwrite, train it "
                "further by raising training.steps and adding --resume, or set output.run_dir to a new directory.")
        raise RunDirectoryError(
            f"{run_dir.path} already holds a run ({done} steps logged). Continue it with --resume, start it over "
            "with --overwrite, or set output.run_dir to a new directory.")
    if not resume:
        return ResumePoint(None, 0, False)
    state = run_dir.last_state()
    try:
        was = run_method(run_dir.path)
    except ValueError as exc:  # config.json is not JSON: not what a run writes (it replaces the file whole)
        raise RunDirectoryError(f"{run_dir.path / CONFIG_FILE} is not a run's config ({exc}): put back the file "
                                "the run wrote, or start over with --overwrite") from None
    if was != spec.method and (state is not None or run_dir.has_metrics()):  # one run directory, one method's records
        raise RunDirectoryError(
            f"{run_dir.path} holds a run of method {was} ({METHOD_WORDS[was]}), and this spec's method is "
            f"{spec.method}: --resume continues a run with its own method. Set output.run_dir to a new directory "
            f"(training.init_from: {run_dir.path} starts from its final weights), or start over with --overwrite.")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        changes = run_dir.check_resume_config(spec.resolved(), spec_sha256)
    if changes:
        console.print("[yellow]warning: resuming with a spec that differs from the one this run started "
                      "with:[/yellow]\n  " + "\n  ".join(changes))
    if state is None and (run_dir.has_metrics() or run_dir.read_warmup()):
        console.print(f"[yellow]no saved state in {run_dir.path} yet; starting again from step 1[/yellow]")
    elif state is None:
        console.print(f"[yellow]nothing to resume in {run_dir.path}: starting a new run[/yellow]")
    completed = int((state or {}).get("batch", 0))
    finished = False
    if state is not None and completed >= steps:
        if run_dir.final_saved(completed):
            raise RunDirectoryError(f"this run already completed {completed} steps (training.steps is {steps}); "
                                    "raise training.steps to train further")
        finished = True  # killed between the last periodic save and the final one: finish what is missing
    return ResumePoint(state, completed, finished)


# ---------------------------------------------------------------- 2. connect
async def connect(spec: Spec, *, spec_path: str, spec_dir: Path, console: Console) -> Backend:
    """The backend for ``sampling.sampler``; a missing key is one line before anything else, and a remote
    Tinker must answer within :func:`connect_timeout_s`."""
    sampler = spec.sampling.sampler
    if sampler == "sail":
        quiet_archive_deprecation()
    if sampler != "local":
        check_keys(sampler, spec_path, spec.model.name, spec_dir)
        console.print(f"connecting to Tinker ({os.environ.get('TINKER_BASE_URL') or 'default endpoint'}) ...")
    backend = open_backend(spec, sampler=sampler, spec_path=spec_path)
    if not backend.is_local:  # the SDK blocks (and retries for minutes) when Tinker is unreachable: bound it
        await call_with_deadline(backend.service_client.get_server_capabilities, connect_timeout_s(), "answer")
    return backend


def connect_timeout_s() -> float:
    """``SAILRL_CONNECT_TIMEOUT_S``, else :data:`CONNECT_TIMEOUT_S`."""
    try:
        return float(os.environ.get("SAILRL_CONNECT_TIMEOUT_S") or CONNECT_TIMEOUT_S)
    except ValueError:
        raise ConfigError(f"SAILRL_CONNECT_TIMEOUT_S must be a number of seconds, got "
                          f"{os.environ['SAILRL_CONNECT_TIMEOUT_S']!r}") from None


async def call_with_deadline(call: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """``call()`` (a blocking Tinker SDK call) in a daemon thread, awaited for at most ``timeout_s`` seconds, so
    an unreachable service is one line within the deadline and Ctrl-C interrupts the wait. Raises
    ``BackendError`` (a user error: the URL, the key or the network) on a timeout or a connection fault."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not done.done():
            done.set_result(value) if ok else done.set_exception(value)

    def target() -> None:
        try:
            value = call()
        except BaseException as exc:  # noqa: BLE001 -- delivered to the awaiting coroutine
            loop.call_soon_threadsafe(settle, False, exc)
        else:
            loop.call_soon_threadsafe(settle, True, value)

    threading.Thread(target=target, name="sailrl-tinker-call", daemon=True).start()
    where = os.environ.get("TINKER_BASE_URL") or "the default endpoint"
    try:
        return await asyncio.wait_for(done, timeout_s)
    except TimeoutError:
        raise BackendError(f"Tinker did not {what} within {timeout_s:g} s ({where}): check TINKER_BASE_URL and "
                           "your network (SAILRL_CONNECT_TIMEOUT_S sets the wait), or train here with --sampler "
                           "local") from None
    except Exception as exc:
        if isinstance(exc, (tinker.APIConnectionError, tinker.APITimeoutError, ConnectionError)):
            raise BackendError(f"cannot reach Tinker ({where}): {type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else ''} -- check TINKER_BASE_URL and "
                               "your network, or train here with --sampler local") from None
        if isinstance(exc, tinker.APIStatusError) and exc.status_code in (401, 403):
            raise BackendError(f"Tinker refused the API key (HTTP {exc.status_code}): check TINKER_API_KEY") \
                from None
        raise


class _FirstArchiveNotice(logging.Filter):
    """Let tinker's deprecation notice of the archive-URL call through once per run, not on every Sail step."""

    seen = False

    def filter(self, record: logging.LogRecord) -> bool:
        if "get_checkpoint_archive_url" not in record.getMessage():
            return True
        first, _FirstArchiveNotice.seen = not _FirstArchiveNotice.seen, True
        return first


def quiet_archive_deprecation() -> None:
    """tinker 0.35 logs (at ERROR) and warns that the archive-URL call sail needs is deprecated, at every call:
    keep the first of each (README, "Why tinker < 0.36"); a refusal still stops the run in one line."""
    logger = logging.getLogger("tinker.lib.public_interfaces.rest_client")
    if not any(isinstance(f, _FirstArchiveNotice) for f in logger.filters):
        logger.addFilter(_FirstArchiveNotice())
    warnings.filterwarnings("once", message=".*get_checkpoint_archive_url.*", category=FutureWarning)


# ---------------------------------------------------------------- 3. training client
def init_weights(spec: Spec, spec_dir: Path | None) -> InitWeights | None:
    """The weights ``training.init_from`` names (None when unset): a checkpoint path as given, or a run directory
    (relative to ``spec_dir``, the spec's folder) read for its final saved state; an
    :class:`~sailrl.runtime.rundir.init_from.InitFromError` when that folder holds no finished run of this model
    and LoRA rank on this backend. Reads only; call it before anything is written."""
    if not spec.training.init_from:
        return None
    return resolve_init_from(spec.training.init_from, spec_dir, model=spec.model.name,
                             lora_rank=spec.model.lora_rank, local=spec.sampling.sampler == "local")


async def open_training_client(backend: Backend, spec: Spec, resume_path: str | None,
                               console: Console, *, init: InitWeights | None = None,
                               spec_dir: Path | None = None) -> tuple[Any, int]:
    """The training client and the LoRA rank it trains: from ``resume_path`` (state + optimizer) when given, else
    a fresh LoRA, loaded with ``training.init_from``'s weights when set (``init``, from :func:`init_weights`;
    resolved here against ``spec_dir`` when not given)."""
    service, m, t = backend.service_client, spec.model, spec.training
    if resume_path:
        training_client = await call_with_deadline(
            lambda: service.create_training_client_from_state_with_optimizer(resume_path), CREATE_TIMEOUT_S,
            f"open the training state {resume_path}") if not backend.is_local else \
            await service.create_training_client_from_state_with_optimizer_async(resume_path)
    else:
        kwargs = dict(base_model=m.name, rank=m.lora_rank, seed=m.seed, train_mlp=m.train_mlp,
                      train_attn=m.train_attn, train_unembed=m.train_unembed)
        training_client = await call_with_deadline(
            lambda: service.create_lora_training_client(**kwargs), CREATE_TIMEOUT_S,
            f"create a LoRA training client for {m.name}") if not backend.is_local \
            else await service.create_lora_training_client_async(**kwargs)
        if t.init_from:
            init = init or init_weights(spec, spec_dir)
            await (await training_client.load_state_async(init.state_path)).result_async()
            if init.run_dir is not None:
                console.print(f"starting from the final weights of {init.run_dir} ({init.state_path})")
    lora_rank = m.lora_rank
    if resume_path:  # the checkpoint decides the adapter's shape, whatever the spec now says
        info = await training_client.get_info_async()
        if getattr(info, "lora_rank", None) and info.lora_rank != m.lora_rank:
            console.print(f"[yellow]the checkpoint's LoRA rank is {info.lora_rank}, the spec says {m.lora_rank}: "
                          f"training and sampling use {info.lora_rank}[/yellow]")
            lora_rank = int(info.lora_rank)
    return training_client, lora_rank


# ---------------------------------------------------------------- 4. inputs
def tokenizer_and_renderer(spec: Spec, backend: Backend, training_client: Any, spec_dir: Path) -> tuple[Any, Any]:
    """The model's tokenizer (the training client's, on the embedded backend) and the spec's renderer
    (``model.renderer``, else the model's default), as every method's run builds its tokens with them."""
    m = spec.model
    tokenizer = training_client.get_tokenizer() if backend.is_local else get_tokenizer(m.name)
    renderer = get_renderer(m.renderer or default_renderer(m.name, spec_dir, embedded=backend.is_local), tokenizer)
    return tokenizer, renderer


def load_inputs(spec: Spec, backend: Backend, training_client: Any, spec_dir: Path, console: Console, *,
                tool_specs: list[dict[str, Any]] | None = None) -> Inputs:
    """Tokenizer and renderer for the model, the reward rules (python rules load from the spec's folder), the
    dataset rows (prompts too long for the context skipped, and said so) and the prompt builder. ``tool_specs``:
    an episode's tools, declared in every prompt (the length check and the warm-up count them)."""
    tokenizer, renderer = tokenizer_and_renderer(spec, backend, training_client, spec_dir)
    reward = spec.reward or RewardSpec.model_construct(rules=[])  # distill without rules: every total is 0
    reward_fn = RewardFunction.from_spec(reward, reference_field=spec.prompt.reference_field, spec_dir=spec_dir)
    if reward_fn.judges:  # kind: judge rules: their clients open on the first judgement
        service = backend.service_client
        unconnected = connect_judges(reward_fn, service_client=None if backend.is_local else service,
                                     local_service=service if backend.is_local else None, spec_dir=spec_dir)
        if unconnected:  # a rule no step could compute: stop before the first step, not train on its fail score
            name, why = next(iter(unconnected.items()))
            more = f" (and {len(unconnected) - 1} more judge rules)" if len(unconnected) > 1 else ""
            raise ConfigError(f"judge rule '{name}' cannot be computed: {why}{more}; the run stops before its "
                              "first step")
    rows = load_rows(spec, spec_dir, reward_fn=reward_fn, renderer=renderer, tool_specs=tool_specs)
    if rows.skipped:
        console.print(f"[yellow]skipped {len(rows.skipped)} dataset rows (first: row {rows.skipped[0].index}: "
                      f"{rows.skipped[0].reason}); see `sailrl preflight` for all[/yellow]")
    return Inputs(tokenizer, renderer, reward_fn, rows, PromptBuilder(spec.prompt, renderer, tool_specs=tool_specs))


def cost_model(spec: Spec, inputs: Inputs) -> CostModel:
    """The run's prices; with a budget, the prompt lengths too (the first step's estimate counts them)."""
    if spec.training.max_cost_usd is None:
        return CostModel.from_spec(spec)
    length = lambda rows: [inputs.prompts.model_input(r).length for r in rows]  # noqa: E731
    return CostModel.from_spec(spec, prompt_token_lengths=length(inputs.rows.train),
                               eval_prompt_token_lengths=length(inputs.rows.eval))


async def probe_judges(inputs: Inputs, reference_field: str | None) -> None:
    """Call each remote judge rule's judge once, on the first training row with its reference answer as the
    reply, before the first step: a judge that cannot be reached (a wrong URL, a refused key, a model the service
    does not serve) stops the run here in one line (:class:`ConfigError`) instead of failing every judgement. A
    local judge needs no call. Costs one judgement per remote judge rule (its answer is cached for the run)."""
    rows = inputs.rows.train
    if not rows:
        return
    fields = dict(rows[0])
    reply = str(fields.get(reference_field, "")) or "ok"
    for name, judge in judge_rules(inputs.reward_fn).items():
        if judge.config.sampler == "local" or not judge.connected:
            continue
        verdict = await judge.judge(reply, fields)
        if verdict.kind == "failed":
            raise ConfigError(f"judge rule '{name}' cannot be computed: {verdict.problem}; the run stops before "
                              "its first step (one judgement was tried on the first training row)")


# ---------------------------------------------------------------- 5. write
def write_run_dir(run_dir: RunDirectory, spec: Spec, start: ResumePoint, *, resume: bool, overwrite: bool,
                  spec_sha256: str, spec_path: str, overrides: list[str], script_text: str | None,
                  is_local: bool, code_sha256: dict[str, str] | None = None,
                  init: InitWeights | None = None) -> tuple[str, int]:
    """Write ``config.json`` (and ``train.py``), drop the logs of steps to re-run; returns the run id (it names
    this run's Sail adapters) and the warm-up steps done. ``code_sha256``: the rule and tool files the run froze;
    ``init``: the weights the run starts from (``init_from`` in ``config.json``: the state path, and the run
    directory it was read from)."""
    t = spec.training
    if not resume and overwrite:
        run_dir.clear_records()
    old_config = run_dir.read_config() if resume else None
    run_id = (old_config or {}).get("run_id") or uuid.uuid4().hex[:8]
    init_record = init.record() if init else (old_config or {}).get("init_from")  # a resumed run keeps its origin
    run_dir.write_config(spec.resolved(), spec_sha256, {"sailrl_version": __version__, "spec_path": spec_path,
                                                        "run_id": run_id, "overrides": list(overrides),
                                                        "code_sha256": dict(code_sha256 or {}),
                                                        **({"init_from": init_record} if init_record else {})})
    if script_text is not None:
        run_dir.write_script(script_text)
    if is_local:  # `sailrl clean` keeps the checkpoints this run directory's --resume needs
        note_run_directory(run_dir.path)
    warmup_total = t.warmup.steps if t.warmup else 0
    if start.completed > 0 or (start.state is None and t.resume_from):  # RL has started, or starts from a state
        warmup_completed = warmup_total
    else:
        warmup_completed = int((start.state or {}).get("warmup", 0))
    run_dir.truncate_metrics(start.completed + 1)
    run_dir.truncate_jsonl(WARMUP_FILE, warmup_completed + 1)
    return run_id, warmup_completed


def open_wandb(spec: Spec, console: Console) -> Any:
    """A wandb run when ``output.wandb_project`` is set and wandb is installed; never required."""
    if not spec.output.wandb_project:
        return None
    try:
        import wandb  # lazy: an optional extra, imported only when output.wandb_project is set
    except ImportError:
        console.print("[yellow]output.wandb_project is set but wandb is not installed (pip install wandb); "
                      "logging to metrics.jsonl only[/yellow]")
        return None
    return wandb.init(project=spec.output.wandb_project, name=spec.name, config=spec.resolved())
