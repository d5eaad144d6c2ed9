"""Connect a reward function's judge rules to the services that run them (see :mod:`sailrl.runtime.rewards.judge`).

:func:`connect_judges` gives each ``kind: judge`` rule its client:

- ``sampler: sail`` -> :class:`~sailrl.runtime.rewards.judge.SailChatClient` (Sail's chat completions on the hosted model;
  ``SAIL_API_KEY`` / ``SAIL_API_URL`` as the sail SDK reads them); without a key the rule is left unconnected with
  that reason (its judgements fail at once, counted, instead of each call failing after its retries);
- ``sampler: tinker`` -> a :class:`~sailrl.runtime.rewards.judge.SamplingJudgeClient` over a Tinker sampling client on
  the base model (``create_sampling_client_async(base_model=...)``; the run's service client, or a new
  ``tinker.ServiceClient``), with the model's renderer;
- ``sampler: local`` -> the same over the embedded backend (the run's local service client when the run is
  local, else one of its own), with the model's renderer.

Sampling clients open on the first judgement (so validate and the run start without waiting for them). A local
judge's own embedded backend belongs to the judges connected with it: the reward function's ``close_judges()``
closes it, after the judgements it has started, and so does the process's exit if nothing did before (a judgement
given up at its timeout goes on in the backend's thread, and the interpreter must not shut down under it).
"""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from typing import Any

from sailrl.runtime.backends.models import default_renderer_name, get_renderer, get_tokenizer
from sailrl.runtime.backends.tinker_service import service_client
from sailrl.runtime.rewards.judge import SailChatClient, SamplingJudgeClient
from sailrl.spec.models import is_unknown_builtin

__all__ = ["connect_judges", "judge_connector", "judge_rules", "not_checked", "sail_key_set"]


def judge_rules(reward_fn: Any) -> dict[str, Any]:
    """The reward function's judges by rule name (empty when it has none)."""
    return dict(getattr(reward_fn, "judges", None) or {})


def connect_judges(reward_fn: Any, *, service_client: Any = None, local_service: Any = None,
                   spec_dir: str | os.PathLike | None = None, only: set[str] | None = None) -> dict[str, str]:
    """Connect every judge rule of ``reward_fn`` (or those named in ``only``); returns rule name -> why it could not
    be connected (plain words; that rule's judgements then fail, counted).

    service_client: the run's Tinker service client (tinker judges use it). local_service: the run's
    ``LocalServiceClient`` when the run is local (local judges sample from it; otherwise one is made for them).
    """
    problems: dict[str, str] = {}
    own_local: Any = None
    own_closer: _CloseOnce | None = None  # the judges sharing own_local share its closing
    for name, judge in judge_rules(reward_fn).items():
        if only is not None and name not in only:
            continue
        c = judge.config
        if is_unknown_builtin(c.model):  # validate says so (S231); nothing to look up on the hub
            problems[name] = f"the judge ({judge.label}) is not a model built into sailrl"
            continue
        try:
            if c.sampler == "sail":
                if not sail_key_set():  # every call would fail (and be retried): it fails at once, said so
                    judge.connect(None)
                    judge.unavailable = problems[name] = (
                        f"the judge ({judge.label}) needs a Sail API key: SAIL_API_KEY is not set (export it, or "
                        "run `sail auth login`)")
                    continue
                judge.connect(SailChatClient(c.model))
                continue
            renderer = _renderer(c.model, c.renderer, spec_dir, embedded=c.sampler == "local")
            if c.sampler == "tinker":
                service = service_client if service_client is not None and not _is_local(service_client) \
                    else _tinker_service()
            else:
                if local_service is None and own_local is None:
                    own_local = _local_service(c.model, spec_dir)
                service = local_service if local_service is not None else own_local
            if service is own_local and own_closer is None:
                own_closer = _CloseOnce(own_local)
            judge.connect(SamplingJudgeClient(_opener(service, c.model), renderer, judge.label,
                                              owns=own_closer if service is own_local else None))
        except Exception as exc:  # noqa: BLE001 - a judge that cannot be opened fails its rule, said once
            problems[name] = f"the judge ({judge.label}) cannot be opened: {type(exc).__name__}: {exc}"[:300]
    return problems


def judge_connector(spec_dir: str | os.PathLike | None, *, every: bool) -> Any:
    """What connects a spec's judge rules where nothing is trained (validate, preflight, the studio): a callable
    ``(reward_fn) -> {rule: why not connected}`` that connects local judges always and the others (which cost
    money and need keys) only when ``every`` (the command's ``--judge``)."""

    def connect(reward_fn: Any) -> dict[str, str]:
        names = {n for n, j in judge_rules(reward_fn).items() if every or j.config.sampler == "local"}
        if not names:
            return {}
        return connect_judges(reward_fn, spec_dir=spec_dir, only=names)

    return connect


def not_checked(reward_fn: Any, problems: dict[str, str], flag: str) -> dict[str, str]:
    """Judge rule -> why it is not checked, for every judge rule of ``reward_fn`` left unconnected: the reason
    ``connect_judges`` gave (``problems``), else that it was not called and that ``flag`` (e.g.
    "`sailrl preflight --judge`") calls it."""
    out: dict[str, str] = {}
    for name, judge in judge_rules(reward_fn).items():
        if not judge.connected:
            out[name] = problems.get(name) or judge.unavailable or (
                f"the judge ({judge.label}) was not called; {flag} calls it (its keys set)")
    return out


def sail_key_set() -> bool:
    """Whether the sail SDK has an API key to call Sail with (``SAIL_API_KEY``, or a ``sail auth login``), as the
    SDK itself resolves it."""
    from sail._core_client import resolved_api_key  # lazy: the sail SDK loads only for a Sail judge

    return bool(resolved_api_key())


def _opener(service: Any, model: str) -> Any:
    async def open_client() -> Any:
        return await service.create_sampling_client_async(base_model=model)

    return open_client


def _is_local(service: Any) -> bool:
    return type(service).__name__ == "LocalServiceClient"


def _renderer(model: str, renderer: str | None, spec_dir: Any, *, embedded: bool = False) -> Any:
    name = renderer or default_renderer_name(model, spec_dir, embedded=embedded)
    if name is None:
        raise ValueError(f"no renderer is known for {model}: set judge.renderer")
    return get_renderer(name, get_tokenizer(model, spec_dir))


def _tinker_service() -> Any:
    return service_client()  # TINKER_BASE_URL's server; tinker is imported only now


def _local_service(model: str, spec_dir: Any) -> Any:
    from sailrl.runtime.backends.local import LocalServiceClient  # lazy: torch loads only for a local judge

    service = LocalServiceClient(model, model_dir=spec_dir)
    atexit.register(_close_at_exit, weakref.ref(service))
    return service


class _CloseOnce:
    """Closes a service the first time :meth:`close` is called (the judges that share it each call it)."""

    def __init__(self, service: Any) -> None:
        self._service: Any = service
        self._lock = threading.Lock()

    def close(self, status: str) -> None:
        with self._lock:
            service, self._service = self._service, None
        if service is not None:
            service.close(status)


def _close_at_exit(ref: weakref.ref) -> None:
    service = ref()
    if service is not None:
        try:
            service.close("done")
        except Exception:  # noqa: BLE001 - exiting anyway; a backend that cannot close has nothing left to save
            pass
