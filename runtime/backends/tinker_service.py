"""The Tinker service a run talks to: Thinking Machines' own, or another server of the Tinker HTTP API.

The tinker SDK reads ``TINKER_BASE_URL`` (unset: Thinking Machines' service). Pointed at another server -- SkyRL's
Tinker API server on your own GPUs, say (docs/tinker-http.md) -- a run needs three things Thinking Machines'
service does not:

- a key: the SDK refuses to start without a ``TINKER_API_KEY`` of its form; a server that checks none gets
  :data:`PLACEHOLDER_KEY` when the variable is unset (:func:`api_key_for`);
- sampling replies without ``sample_sequence_ids``: SDK 0.35 asserts that every sampling promise carries them
  (Thinking Machines' does; SkyRL's, which speaks the SDK 0.25 protocol, does not). :func:`service_client`
  wraps the SDK's check (:func:`tolerate_missing_ids`): a reply without ids is taken as it came, one with ids as the
  SDK takes it;
- loss functions it offers: SkyRL's has no ``dro``. The request that names one it lacks is refused (HTTP 422, at
  the run's first ``forward_backward``); :func:`refusal` turns that into one line naming the loss and the ones the
  service offers (:class:`TinkerRefused`).

Whichever the server, a run must not wait forever for one that is gone: the SDK retries a result it polls for as
long as the connection is refused. :func:`service_client` installs :class:`OutageClock` on the SDK's one HTTP
entry point (``AsyncAPIClient.request``): once no request has been answered for ``SAILRL_TINKER_UNREACHABLE_S``
seconds (default :data:`UNREACHABLE_S`, the SDK's own retry window for a request it submits), the next connection
failure raises :class:`TinkerUnreachable`, a ``ConnectionError`` the SDK does not retry, so the step stops with
one line and ``--resume`` continues from the last saved state.

Nothing here imports tinker at module level: ``runtime.backends`` (imported by ``sailrl clean``) and
``runtime.backends.judge_clients`` (imported by ``sailrl validate``) import this module.
"""

from __future__ import annotations

import functools
import os
import threading
import time
import urllib.parse
from typing import Any

from sailrl.spec.errors import ConfigError, ServiceError

__all__ = ["DEFAULT_BASE_URL", "PLACEHOLDER_KEY", "THINKING_MACHINES_HOSTS", "UNREACHABLE_S", "OutageClock",
           "TinkerRefused", "TinkerUnreachable", "api_key_for", "base_url", "other_server",
           "refusal", "service_client", "tolerate_missing_ids", "unreachable_s"]

#: The SDK's default (``tinker.lib.base_url.DEFAULT_BASE_URL``, checked by a test against the installed SDK).
DEFAULT_BASE_URL = "https://tinker.thinkingmachines.dev/services/tinker-prod"
#: Host names (and their subdomains) of Thinking Machines' service.
THINKING_MACHINES_HOSTS = ("thinkingmachines.dev", "thinkingmachines.ai")
#: The key the SDK is given for another server when ``TINKER_API_KEY`` is unset: of the form the SDK requires
#: (``tml-...``), and plainly not a real key.
PLACEHOLDER_KEY = "tml-not-a-key-for-another-tinker-server"
#: Seconds without any answer from the service after which a connection failure stops the run.
UNREACHABLE_S = 300.0


def base_url() -> str:
    """The Tinker API the SDK will call: ``TINKER_BASE_URL`` (empty counts as unset, a trailing ``/`` dropped, as
    the SDK does), else :data:`DEFAULT_BASE_URL`."""
    return (os.environ.get("TINKER_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")


def other_server(url: str | None = None) -> str | None:
    """``url`` (default :func:`base_url`) when it names a server other than Thinking Machines', else None."""
    url = base_url() if url is None else url
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    if any(host == h or host.endswith("." + h) for h in THINKING_MACHINES_HOSTS):
        return None
    return url


def api_key_for(url: str | None = None) -> str | None:
    """The key to give the SDK: ``TINKER_API_KEY`` when set; for another server without one,
    :data:`PLACEHOLDER_KEY`; else None (the SDK then reports the missing key itself)."""
    key = os.environ.get("TINKER_API_KEY")
    if key:
        return key
    return PLACEHOLDER_KEY if other_server(url) and not os.environ.get("TINKER_CREDENTIAL_CMD") else None


def tolerate_missing_ids(attach: Any) -> Any:
    """The SDK's ``_attach_sequence_ids`` (``tinker.lib.public_interfaces.sampling_client``) made tolerant of a
    server that sends no ids: then the response is returned as it came (its sequences' ``sequence_id`` as the server
    left it; sailrl does not read it); with ids, the SDK's own ``attach``."""
    if getattr(attach, "__sailrl_tolerant__", False):
        return attach

    @functools.wraps(attach)
    def tolerant(response: Any, sample_sequence_ids: list[str] | None) -> Any:
        return response if sample_sequence_ids is None else attach(response, sample_sequence_ids)

    tolerant.__sailrl_tolerant__ = True
    return tolerant


def _tolerate_missing_sequence_ids() -> None:
    # lazy: tinker takes seconds; only a run against another Tinker server reaches this
    from tinker.lib.public_interfaces import sampling_client

    sampling_client._attach_sequence_ids = tolerate_missing_ids(sampling_client._attach_sequence_ids)


class TinkerUnreachable(ServiceError, ConnectionError):
    """The Tinker service has answered no request for longer than :func:`unreachable_s` (one line)."""

    code = "E111"


def unreachable_s() -> float:
    """``SAILRL_TINKER_UNREACHABLE_S``, else :data:`UNREACHABLE_S`."""
    value = os.environ.get("SAILRL_TINKER_UNREACHABLE_S") or str(UNREACHABLE_S)
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ConfigError(f"SAILRL_TINKER_UNREACHABLE_S must be a positive number of seconds, got {value!r}")
    return seconds


class OutageClock:
    """Since when no request to the service has been answered (any HTTP answer counts, an error status too), and
    the wrapper of the SDK's ``AsyncAPIClient.request`` that reads it. One per process: every client the SDK
    opens (training, sampling, heartbeat) shares the connection to one service."""

    def __init__(self, limit_s: float, clock: Any = time.monotonic) -> None:
        self.limit_s, self.clock = limit_s, clock
        self._lock = threading.Lock()
        self._since: float | None = None

    def answered(self) -> None:
        with self._lock:
            self._since = None

    def failed(self) -> float:
        """Record a connection failure; the seconds since the first failure with no answer after it."""
        with self._lock:
            now = self.clock()
            if self._since is None:
                self._since = now
            return now - self._since

    def wrap(self, request: Any, connection_errors: tuple[type[BaseException], ...],
             status_errors: tuple[type[BaseException], ...]) -> Any:
        @functools.wraps(request)
        async def bounded(client: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                result = await request(client, *args, **kwargs)
            except status_errors as exc:
                self.answered()
                line = refusal(exc.status_code, exc.body) if _loss_fn_refused(exc.body) else None
                if line:
                    raise TinkerRefused(line) from exc
                raise
            except connection_errors as exc:
                silent = self.failed()
                if silent >= self.limit_s:
                    raise TinkerUnreachable(
                        f"the Tinker service at {base_url()} has not answered for {silent:.0f} s "
                        f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); is it running? "
                        "(SAILRL_TINKER_UNREACHABLE_S sets the wait)") from exc
                raise
            except Exception:
                self.answered()  # an HTTP error status is an answer: the service is there
                raise
            self.answered()
            return result

        bounded.__sailrl_outage_clock__ = self
        return bounded


def _bound_outages() -> None:
    import tinker  # lazy: see service_client
    from tinker._base_client import AsyncAPIClient  # lazy: the same

    current = AsyncAPIClient.request
    clock = getattr(current, "__sailrl_outage_clock__", None)
    limit = unreachable_s()
    if clock is not None:
        clock.limit_s = limit
        return
    AsyncAPIClient.request = OutageClock(limit).wrap(current, (tinker.APIConnectionError,), (tinker.APIStatusError,))
    _refusals_of_results()


def _loss_fn_refused(body: Any) -> bool:
    detail = body.get("detail") if isinstance(body, dict) else None
    return isinstance(detail, list) and any(isinstance(i, dict) and "loss_fn" in map(str, i.get("loc") or ())
                                            for i in detail)


def _refusals_of_results() -> None:
    """The SDK raises a bare ``ValueError`` when the service refuses a result request for good (a server restarted
    since it took the request answers HTTP 400, "not loaded"): :class:`TinkerRefused` with the service's words
    instead, a service fault and not a bug."""
    from tinker.lib.api_future_impl import _APIFuture  # lazy: see service_client

    original = _APIFuture._handle_transport_error
    if getattr(original, "__sailrl_refusals__", False):
        return

    @functools.wraps(original)
    async def handle(self: Any, err: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await original(self, err, *args, **kwargs)
        except ValueError as exc:
            body = getattr(getattr(err, "exception", None), "body", None)
            line = refusal(err.status_code, body if body is not None else err.detail)
            if line:
                raise TinkerRefused(line) from exc
            raise

    handle.__sailrl_refusals__ = True
    _APIFuture._handle_transport_error = handle


def service_client() -> Any:
    """A ``tinker.ServiceClient`` for :func:`base_url`, its outages bounded (:class:`OutageClock`). For another
    server: the key from :func:`api_key_for`, and sampling replies without ``sample_sequence_ids`` accepted
    (:func:`tolerate_missing_ids`)."""
    import tinker  # lazy: tinker takes seconds; `sailrl clean` and `sailrl validate` import this module

    _bound_outages()
    if other_server():
        _tolerate_missing_sequence_ids()
    return tinker.ServiceClient(api_key=api_key_for())


class TinkerRefused(ServiceError):
    """The Tinker service refused a request for good: a loss it does not offer, a model it no longer holds (one
    line)."""

    code = "E112"


def refusal(status: int | None, body: Any) -> str | None:
    """One line for a refusal the SDK would report as a long message or a bare ``ValueError``, else None: a loss
    the service does not offer (HTTP 4xx naming ``loss_fn``, with the losses it offers when it says), or the answer
    to a result request (``detail``), e.g. a server restarted since it took the request."""
    if status is None or not 400 <= status < 500:
        return None
    where = f"the Tinker service at {base_url()}"
    detail = body.get("detail") if isinstance(body, dict) else body
    for item in detail if isinstance(detail, list) else []:
        if isinstance(item, dict) and "loss_fn" in map(str, item.get("loc") or ()):
            offers = (item.get("ctx") or {}).get("expected")
            return (f"{where} does not offer loss_fn {item.get('input')!r} (HTTP {status})"
                    + (f"; it offers {offers}" if offers else "")
                    + ": set training.loss_fn to one of those and run again (--resume continues a started run)")
    if isinstance(detail, str) and detail:
        text = " ".join(detail.split())[:300]
        hint = (": it was restarted or dropped this run's model; continue with --resume" if "not loaded" in text
                else "")
        return f"{where} refused a request (HTTP {status}): {text}{hint}"
    return None
