"""signed_checkpoint_url / signed_url_problem with fake Tinker service and rest clients (no network)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from sailrl.runtime.sail import (
    SailCheckpointError,
    signed_checkpoint_url,
    signed_url_problem,
    tinker_rest_client_class,
)

PATH = "tinker://run-1:train:0/sampler_weights/step-3"
URL = "https://storage.example/archive.tar?X-Sig=abc"


class FakeRest:
    """The two RestClient methods sail.get_tinker_checkpoint_signed_url_async uses, recording calls."""

    def __init__(self, answer: Any = None, error: Exception | None = None) -> None:
        self.calls: list[tuple[str, tuple]] = []
        self.answer = SimpleNamespace(url=URL, expires="2026-12-01T00:00:00Z") if answer is None else answer
        self.error = error

    async def set_checkpoint_ttl_from_tinker_path_async(self, tinker_path: str, ttl_seconds: int | None) -> None:
        self.calls.append(("ttl", (tinker_path, ttl_seconds)))

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


def test_rest_client_without_archive_url_explains_the_version_problem() -> None:
    with pytest.raises(SailCheckpointError) as info:
        asyncio.run(signed_checkpoint_url(FakeService(RestWithoutArchiveUrl()), PATH, 3600))
    message = str(info.value)
    assert PATH in message
    assert "get_checkpoint_archive_url_from_tinker_path_async" in message and "0.35.0" in message


def test_signed_url_problem_matches_the_installed_tinker() -> None:
    assert signed_url_problem(FakeRest) is None
    assert "tinker 0.35.0 does" in (signed_url_problem(RestWithoutArchiveUrl) or "")
    has_method = callable(getattr(tinker_rest_client_class(), "get_checkpoint_archive_url_from_tinker_path_async", None))
    assert (signed_url_problem() is None) == has_method


@pytest.mark.skipif(
    callable(getattr(tinker_rest_client_class(), "get_checkpoint_archive_url_from_tinker_path_async", None)),
    reason="the installed tinker still has the archive-URL method sail needs",
)
def test_the_real_tinker_rest_client_class_is_reported_plainly() -> None:
    rest = object.__new__(tinker_rest_client_class())  # the real class, never connected (ttl None: no request is made)
    with pytest.raises(SailCheckpointError, match="The installed tinker .* has no RestClient"):
        asyncio.run(signed_checkpoint_url(FakeService(rest), PATH, None))
