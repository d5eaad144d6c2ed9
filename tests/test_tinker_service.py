"""A Tinker service other than Thinking Machines' (``runtime/tinker_service.py``): which URL counts as another server,
the key the SDK gets, sampling replies without ``sample_sequence_ids``. The server itself: tests/test_tinker_http.py."""

from __future__ import annotations

import pytest
import tinker
from tinker.lib import base_url as sdk_base_url
from tinker.lib.public_interfaces import sampling_client as sdk_sampling

from sailrl.runtime import tinker_service
from sailrl.runtime.backends import BackendError, check_keys
from sailrl.runtime.tinker_service import (
    PLACEHOLDER_KEY,
    api_key_for,
    attach_sequence_ids,
    other_server,
    service_client,
)


@pytest.fixture(autouse=True)
def _no_tinker_env(monkeypatch):
    for var in ("TINKER_BASE_URL", "TINKER_API_KEY", "TINKER_CREDENTIAL_CMD"):
        monkeypatch.delenv(var, raising=False)
    # service_client() installs its sampling hook in the SDK module: put the SDK's back after each test
    monkeypatch.setattr(sdk_sampling, "_attach_sequence_ids", sdk_sampling._attach_sequence_ids)


def _response(n: int) -> tinker.SampleResponse:
    return tinker.SampleResponse(sequences=[tinker.SampledSequence(stop_reason="stop", sequence_id="",
                                                                   _tokens_list=[5 + i], _logprobs_list=[-0.5])
                                            for i in range(n)])


def test_the_default_endpoint_is_the_sdks():
    assert tinker_service.DEFAULT_BASE_URL == sdk_base_url.DEFAULT_BASE_URL
    assert tinker_service.base_url() == sdk_base_url.resolve_base_url()


@pytest.mark.parametrize(("url", "other"), [
    (None, False),
    ("https://tinker.thinkingmachines.dev/services/tinker-prod", False),
    ("https://api.thinkingmachines.ai/tinker", False),
    ("http://127.0.0.1:8000", True),
    ("https://tinker.example.org/", True),
    ("https://notthinkingmachines.dev", True),  # a suffix of the host name is not a subdomain
])
def test_which_urls_are_another_server(monkeypatch, url, other):
    if url is not None:
        monkeypatch.setenv("TINKER_BASE_URL", url)
    assert other_server() == (url.rstrip("/") if other else None)


def test_another_server_without_a_key_gets_the_placeholder_and_passes_the_key_check(monkeypatch):
    with pytest.raises(BackendError, match="TINKER_API_KEY is not set"):
        check_keys("tinker")
    assert api_key_for() is None
    monkeypatch.setenv("TINKER_BASE_URL", "http://127.0.0.1:8000")
    check_keys("tinker")
    assert api_key_for() == PLACEHOLDER_KEY
    with pytest.raises(BackendError, match="TINKER_API_KEY is not set"):  # Sail signs URLs with Tinker's own key
        check_keys("sail")
    monkeypatch.setenv("TINKER_API_KEY", "tml-mine")
    assert api_key_for() == "tml-mine"
    monkeypatch.setenv("TINKER_API_KEY", "not-a-tml-key")  # a key that is set is checked, whichever the server
    with pytest.raises(BackendError, match="does not look like a Tinker API key"):
        check_keys("tinker")


def test_a_sampling_reply_without_sequence_ids_is_accepted():
    response = _response(2)
    with pytest.raises(AssertionError, match="sample_sequence_ids"):  # the SDK's own, for Thinking Machines'
        sdk_sampling._attach_sequence_ids(response, None)
    assert attach_sequence_ids(response, None) is response
    numbered = attach_sequence_ids(response, ["a", "b"])
    assert [s.sequence_id for s in numbered.sequences] == ["a", "b"]
    assert numbered == sdk_sampling._attach_sequence_ids(response, ["a", "b"])
    with pytest.raises(ValueError, match="1 sequence ids for 2 sequences"):
        attach_sequence_ids(response, ["a"])


def test_a_client_for_another_server_tolerates_missing_ids_and_one_for_thinking_machines_does_not(monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", "tml-mine")
    service_client()  # no request is made until a method is called
    assert sdk_sampling._attach_sequence_ids is not attach_sequence_ids
    monkeypatch.setenv("TINKER_BASE_URL", "http://127.0.0.1:9")
    client = service_client()
    assert sdk_sampling._attach_sequence_ids is attach_sequence_ids
    assert isinstance(client, tinker.ServiceClient)
