"""The signed archive URL Sail downloads a Tinker sampler checkpoint from, and plain words when Tinker refuses it.

sail 0.17.1 signs checkpoint URLs through one Tinker call, ``RestClient.get_checkpoint_archive_url_from_tinker_path
_async``. tinker 0.35 marks it deprecated ("the server may already reject it for your organization") and tinker
0.36+ no longer has it; when Tinker refuses it (an HTTP 4xx) or the method is missing, signing raises
`CheckpointURLRefused` with one line naming the cause and the options.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import re
from typing import Any

import sail
import tinker
from sail.errors import InferenceError

from sailrl.spec.errors import SailrlError, ServiceError

__all__ = [
    "ARCHIVE_URL_METHOD",
    "CheckpointURLRefused",
    "SailCheckpointError",
    "signed_checkpoint_url",
    "signed_url_problem",
    "tinker_rest_client_class",
]

#: The Tinker RestClient method sail signs checkpoint URLs with.
ARCHIVE_URL_METHOD = "get_checkpoint_archive_url_from_tinker_path_async"

#: HTTP statuses of a refusal that waiting or retrying may fix: not a refusal of the call itself.
_TRANSIENT_4XX = frozenset({408, 425, 429})

_OPTIONS = (
    "Options: set `sampling.sampler: tinker` to sample on Tinker itself (no Sail), or `sampling.sampler: local` "
    "for the embedded backend; or upgrade sail once a release signs checkpoints without this call. sailrl pins "
    "tinker<0.36 because tinker 0.36 and later no longer have it."
)


class SailCheckpointError(ServiceError):
    """A signed download URL for a Tinker checkpoint could not be obtained (a ``RuntimeError``)."""

    code = "E140"
    fatal = True  # a failed rollout with this error stops the run (not one dropped group)


class CheckpointURLRefused(SailCheckpointError):
    """Tinker will not sign archive URLs, so Sail cannot sample any checkpoint of this run.

    Raised when the archive-URL call answers HTTP 4xx (except the transient 408/425/429) or the installed tinker's
    RestClient has no such method. ``str(exc)`` is one line: the cause and the options. ``status_code``: the HTTP
    status, or None when the method is missing. Retrying cannot help: stop the run with its state saved.
    """

    code = "E141"

    def __init__(self, message: str, *, status_code: int | None) -> None:
        super().__init__(message)
        self.status_code = status_code


def _versions() -> tuple[str, str]:
    def version(name: str) -> str:
        try:
            return md.version(name)
        except md.PackageNotFoundError:  # pragma: no cover - both are dependencies
            return "unknown"

    return version("tinker"), version("sail")


def _one_line(text: str, limit: int = 200) -> str:
    """``text`` with runs of whitespace (newlines included) collapsed to one space, cut to ``limit`` characters."""
    flat = re.sub(r"\s+", " ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def tinker_rest_client_class() -> type:
    """The SDK's RestClient class: ``tinker.RestClient`` where exported, else its defining module's."""
    cls = getattr(tinker, "RestClient", None)
    if cls is None:
        # lazy: a fallback for SDK versions that do not export tinker.RestClient
        from tinker.lib.public_interfaces.rest_client import RestClient as cls
    return cls


def _missing_method_message(tinker_path: str | None) -> str:
    tinker_version, sail_version = _versions()
    what = f"the checkpoint {tinker_path}" if tinker_path else "each Tinker checkpoint"
    return (
        f"The installed tinker ({tinker_version}) has no RestClient.{ARCHIVE_URL_METHOD}, which sail "
        f"{sail_version} needs to give Sail a download link to {what}. Install tinker 0.35.0 "
        "(pip install 'tinker>=0.34,<0.36'), the last release that has it. " + _OPTIONS
    )


def signed_url_problem(rest_client_cls: type | None = None) -> str | None:
    """Why ``sail.get_tinker_checkpoint_signed_url_async`` cannot work with ``rest_client_cls``, or None.

    The problem is the missing ``RestClient`` method `ARCHIVE_URL_METHOD` (tinker 0.36 and later); the answer is
    one line naming the versions and the options. ``rest_client_cls`` defaults to the installed
    `tinker_rest_client_class`. A server that refuses the call is only seen when it is made
    (`signed_checkpoint_url`).
    """
    if rest_client_cls is None:
        rest_client_cls = tinker_rest_client_class()
    if callable(getattr(rest_client_cls, ARCHIVE_URL_METHOD, None)):
        return None
    return _missing_method_message(None)


class _ArchiveCallFailed(SailrlError):
    """The archive-URL call itself raised (wraps its exception, so the TTL call's errors are told apart)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class _AttributingRestClient:
    """A rest client proxy whose `ARCHIVE_URL_METHOD` raises `_ArchiveCallFailed` around any failure."""

    def __init__(self, rest: Any) -> None:
        self._rest = rest

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._rest, name)
        if name != ARCHIVE_URL_METHOD or not callable(attr):
            return attr

        @functools.wraps(attr)
        async def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return await attr(*args, **kwargs)
            except Exception as exc:
                raise _ArchiveCallFailed(exc) from exc

        return call


class _AttributingServiceClient:
    def __init__(self, service_client: Any) -> None:
        self._service_client = service_client

    def create_rest_client(self) -> _AttributingRestClient:
        return _AttributingRestClient(self._service_client.create_rest_client())


def _refusal(exc: BaseException, tinker_path: str) -> CheckpointURLRefused | None:
    """A `CheckpointURLRefused` when ``exc`` (raised by the archive-URL call) is an HTTP 4xx refusal, else None."""
    if not isinstance(exc, tinker.APIStatusError):
        return None
    status = exc.status_code
    if not 400 <= status < 500 or status in _TRANSIENT_4XX:
        return None
    tinker_version, sail_version = _versions()
    detail = _one_line(getattr(exc, "message", None) or str(exc))
    return CheckpointURLRefused(
        f"Tinker refused to sign a download link for the checkpoint {tinker_path} (HTTP {status}: {detail}). "
        f"sail {sail_version} gives Sail checkpoints only through RestClient.{ARCHIVE_URL_METHOD}, which tinker "
        f"{tinker_version} marks deprecated and its server may reject. " + _OPTIONS,
        status_code=status,
    )


async def signed_checkpoint_url(service_client: Any, tinker_path: str, ttl_seconds: int | None) -> str:
    """The signed archive URL (https) Sail downloads the Tinker checkpoint ``tinker_path`` from.

    Calls ``sail.get_tinker_checkpoint_signed_url_async(service_client, tinker_path, ttl_seconds=...)``: with
    ``ttl_seconds`` (a positive number of seconds, or None for no expiry) Tinker is first told to delete the
    checkpoint after that long, so per-step checkpoints clean themselves up.

    Raises `CheckpointURLRefused` (one line: cause and options) when Tinker refuses the archive-URL call with an
    HTTP 4xx other than 408/425/429, or the installed tinker lacks the method; `SailCheckpointError` (plain words,
    the path and the cause) for any other failure (a Tinker 5xx, a connection error, an answer without a URL);
    ValueError for a ``ttl_seconds`` that is not positive.
    """
    if ttl_seconds is not None and (isinstance(ttl_seconds, bool) or ttl_seconds <= 0):
        raise ValueError(f"ttl_seconds must be a positive number of seconds or None, got {ttl_seconds!r}")
    try:
        return await sail.get_tinker_checkpoint_signed_url_async(
            _AttributingServiceClient(service_client), tinker_path, ttl_seconds=ttl_seconds
        )
    except _ArchiveCallFailed as failed:
        exc = failed.error
        refused = _refusal(exc, tinker_path)
        if refused is not None:
            raise refused from exc
        raise SailCheckpointError(
            f"Tinker could not give a download link for the checkpoint {tinker_path}: "
            f"{type(exc).__name__}: {_one_line(str(exc))}"
        ) from exc
    except InferenceError as exc:  # the SDK's own checks: a missing method, an answer without a URL
        if ARCHIVE_URL_METHOD in str(exc):
            raise CheckpointURLRefused(_missing_method_message(tinker_path), status_code=None) from exc
        raise SailCheckpointError(
            f"Could not get a download link for the Tinker checkpoint {tinker_path}: {_one_line(str(exc))}"
        ) from exc
    except Exception as exc:  # the TTL call's errors (tinker.APIError, connection errors)
        raise SailCheckpointError(
            f"Tinker could not give a download link for the checkpoint {tinker_path}: "
            f"{type(exc).__name__}: {_one_line(str(exc))}"
        ) from exc
