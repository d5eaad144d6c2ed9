"""signed_checkpoint_url / signed_url_problem with fake Tinker service and rest clients (no network).

A refusal is faked at the rest-client boundary: the archive-URL method raises tinker's own exception classes,
built from an ``httpx.Response`` as tinker's client builds them.
"""

from __future__ import annotations

import asyncio
import importlib.metadata as md
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import tinker

from sailrl.runtime.backends.sail import (
    CheckpointURLRefused,
    SailCheckpointError,
    signed_checkpoint_url,
    signed_url_problem,
    tinker_rest_client_class,
)
from sailrl.spec.errors import ServiceError

PATH = "tinker://run-1:train:0/sampler_weights/step-3"
URL = "https://storage.example/archive.tar?X-Sig=abc"


class FakeRest:
    """The two RestClient methods sail.get_tinker_checkpoint_signed_url_async uses, recording calls."""

    def __init__(self, answer: Any = None, error: Exception | None = None, ttl_error: Exception | None = None) -> None:
        self.calls: list[tuple[str, tuple]] = []
        self.answer = SimpleNamespace(url=URL, expires="2026-12-01T00:00:00Z") if answer is None else answer
        self.error = error
        self.ttl_error = ttl_error

    async def set_checkpoint_ttl_from_tinker_path_async(self, tinker_path: str, ttl_seconds: int | None) -> None:
        self.calls.append(("ttl", (tinker_path, ttl_seconds)))
        if self.ttl_error is not None:
            raise self.ttl_error

    async def get_checkpoint_archive_url_from_tinker_path_async(self, tinker_path: str) -> Any:
        self.calls.append(("url", (tinker_path,)))
        if self.error is not None:
            raise self.error
        return self.answer


class RestWithoutArchiveUrl:
    """What tinker 0.36+ RestClient offers: a TTL setter but no archive URL."""

    async def set_checkpoint_ttl_from_tinker_path_async(self, tinker_path: str, ttl_seconds: int | None) -> None:
        return None


class FakeService:
    def __init__(self, rest: Any) -> None:
        self.rest = rest

    def create_rest_client(self) -> Any:
        return self.rest


def test_sets_ttl_then_returns_the_url() -> None:
    rest = FakeRest()
    assert asyncio.run(signed_checkpoint_url(FakeService(rest), PATH, 3600)) == URL
    assert rest.calls == [("ttl", (PATH, 3600)), ("url", (PATH,))]


def test_no_ttl_skips_the_ttl_call_and_accepts_plain_strings_and_mappings() -> None:
    rest = FakeRest(answer=URL)
    assert asyncio.run(signed_checkpoint_url(FakeService(rest), PATH, None)) == URL
    assert rest.calls == [("url", (PATH,))]
    rest = FakeRest(answer={"signed_url": URL + "&m=1"})
    assert asyncio.run(signed_checkpoint_url(FakeService(rest), PATH, None)) == URL + "&m=1"


def test_bad_ttl_is_refused() -> None:
    with pytest.raises(ValueError, match="ttl_seconds"):
        asyncio.run(signed_checkpoint_url(FakeService(FakeRest()), PATH, 0))


def test_answer_without_url_is_a_checkpoint_error() -> None:
    rest = FakeRest(answer=SimpleNamespace(expires="soon"))
    with pytest.raises(SailCheckpointError, match="did not include a URL"):
        asyncio.run(signed_checkpoint_url(FakeService(rest), PATH, None))


def test_tinker_api_error_is_wrapped_with_the_path() -> None:
    rest = FakeRest(error=ConnectionError("tinker unreachable"))
    with pytest.raises(SailCheckpointError) as info:
        asyncio.run(signed_checkpoint_url(FakeService(rest), PATH, 3600))
    assert PATH in str(info.value) and "ConnectionError: tinker unreachable" in str(info.value)
    assert isinstance(info.value.__cause__, ConnectionError)


def test_rest_client_without_archive_url_is_a_refusal_with_the_versions_and_options() -> None:
    with pytest.raises(CheckpointURLRefused) as info:
        asyncio.run(signed_checkpoint_url(FakeService(RestWithoutArchiveUrl()), PATH, 3600))
    message = str(info.value)
    assert "\n" not in message and info.value.status_code is None
    assert message.startswith(
        f"The installed tinker ({md.version('tinker')}) has no RestClient.get_checkpoint_archive_url_from_tinker_"
        f"path_async, which sail {md.version('sail')} needs to give Sail a download link to the checkpoint {PATH}. "
        "Install tinker 0.35.0 (pip install 'tinker>=0.34,<0.36'), the last release that has it. Options: set "
        "`sampling.sampler: tinker` to sample on Tinker itself")


def test_signed_url_problem_matches_the_installed_tinker() -> None:
    assert signed_url_problem(FakeRest) is None
    problem = signed_url_problem(RestWithoutArchiveUrl) or ""
    assert "each Tinker checkpoint" in problem and "tinker 0.35.0" in problem and "\n" not in problem
    has_method = callable(getattr(tinker_rest_client_class(), "get_checkpoint_archive_url_from_tinker_path_async", None))
    assert (signed_url_problem() is None) == has_method


@pytest.mark.skipif(
    callable(getattr(tinker_rest_client_class(), "get_checkpoint_archive_url_from_tinker_path_async", None)),
    reason="checks the message for a tinker without the archive-URL method sail needs; the installed tinker has it",
)
def test_the_real_tinker_rest_client_class_is_reported_plainly() -> None:
    rest = object.__new__(tinker_rest_client_class())  # the real class, never connected (ttl None: no request is made)
    with pytest.raises(SailCheckpointError, match="The installed tinker .* has no RestClient"):
        asyncio.run(signed_checkpoint_url(FakeService(rest), PATH, None))


# ------------------------------------------------------------------------------------------------------
# Tinker refusing the archive-URL call (tinker 0.35 warns its server "may already reject it")
# ------------------------------------------------------------------------------------------------------


def _status_error(status: int, message: str) -> tinker.APIStatusError:
    """The exception tinker's client raises for an HTTP ``status`` answer (``_make_status_error``'s classes)."""
    request = httpx.Request("GET", "https://tinker.example/api/v1/weights/archive_url")
    response = httpx.Response(status, request=request, json={"detail": message})
    cls = {400: tinker.BadRequestError, 403: tinker.PermissionDeniedError, 404: tinker.NotFoundError,
           429: tinker.RateLimitError, 500: tinker.InternalServerError}.get(status, tinker.APIStatusError)
    return cls(message, response=response, body={"detail": message})


@pytest.mark.parametrize("status", [400, 403, 404, 410])
def test_a_4xx_from_the_archive_url_call_is_a_one_line_refusal(status: int) -> None:
    error = _status_error(status, "Checkpoint archive URLs are no longer supported.\nUse save_weights_external().")
    rest = FakeRest(error=error)
    with pytest.raises(CheckpointURLRefused) as info:
        asyncio.run(signed_checkpoint_url(FakeService(rest), PATH, 3600))
    refused = info.value
    assert isinstance(refused, SailCheckpointError) and isinstance(refused, ServiceError)
    assert isinstance(refused, RuntimeError) and refused.status_code == status and refused.__cause__ is error
    assert str(refused) == (
        f"Tinker refused to sign a download link for the checkpoint {PATH} (HTTP {status}: Checkpoint archive URLs "
        "are no longer supported. Use save_weights_external().). "
        f"sail {md.version('sail')} gives Sail checkpoints only through "
        f"RestClient.get_checkpoint_archive_url_from_tinker_path_async, which tinker {md.version('tinker')} marks "
        "deprecated and its server may reject. Options: set `sampling.sampler: tinker` to sample on Tinker itself "
        "(no Sail), or `sampling.sampler: local` for the embedded backend; or upgrade sail once a release signs "
        "checkpoints without this call. sailrl pins tinker<0.36 because tinker 0.36 and later no longer have it."
    )
    assert rest.calls == [("ttl", (PATH, 3600)), ("url", (PATH,))]


def test_a_long_refusal_detail_is_cut() -> None:
    rest = FakeRest(error=_status_error(410, "x" * 5000))
    with pytest.raises(CheckpointURLRefused) as info:
        asyncio.run(signed_checkpoint_url(FakeService(rest), PATH, None))
    assert "(HTTP 410: " + "x" * 197 + "...)" in str(info.value) and len(str(info.value)) < 1000


@pytest.mark.parametrize("status", [429, 500, 503])
def test_transient_statuses_are_not_a_refusal(status: int) -> None:
    with pytest.raises(SailCheckpointError) as info:
        asyncio.run(signed_checkpoint_url(FakeService(FakeRest(error=_status_error(status, "busy"))), PATH, None))
    assert not isinstance(info.value, CheckpointURLRefused)
    assert str(info.value).startswith(f"Tinker could not give a download link for the checkpoint {PATH}: ")


def test_a_4xx_from_the_ttl_call_is_not_blamed_on_the_archive_url() -> None:
    rest = FakeRest(ttl_error=_status_error(404, "no such checkpoint"))
    with pytest.raises(SailCheckpointError) as info:
        asyncio.run(signed_checkpoint_url(FakeService(rest), PATH, 3600))
    assert not isinstance(info.value, CheckpointURLRefused)
    assert "NotFoundError: no such checkpoint" in str(info.value)
    assert rest.calls == [("ttl", (PATH, 3600))]


def test_the_real_tinker_rest_client_exposes_the_archive_url_method_with_tinkers_error_types() -> None:
    """The refusal test above fakes exactly this boundary: the method sail calls, raising tinker's status error."""
    assert issubclass(tinker.NotFoundError, tinker.APIStatusError)
    cls = tinker_rest_client_class()
    assert signed_url_problem(cls) is None, "the installed tinker lost the archive-URL call: pin tinker<0.36"
