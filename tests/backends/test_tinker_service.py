"""A Tinker service other than Thinking Machines' (``runtime/backends/tinker_service.py``): which URL counts as another server,
the key the SDK gets, sampling replies without ``sample_sequence_ids``. The server itself: tests/backends/test_tinker_http.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import tinker
from tinker._base_client import AsyncAPIClient
from tinker.lib import base_url as sdk_base_url
from tinker.lib.api_future_impl import _APIFuture
from tinker.lib.public_interfaces import sampling_client as sdk_sampling

from sailrl.runtime.backends import tinker_service
from sailrl.runtime.backends.backend import BackendError, check_keys
from sailrl.runtime.backends.tinker_service import (
    PLACEHOLDER_KEY,
    OutageClock,
    TinkerRefused,
    TinkerUnreachable,
    api_key_for,
    other_server,
    refusal,
    service_client,
    tolerate_missing_ids,
    unreachable_s,
)
from sailrl.spec.errors import ConfigError
from tests.fakes.skyrl_server import unpatch_sdk


@pytest.fixture(autouse=True)
def _no_tinker_env(monkeypatch):
    for var in ("TINKER_BASE_URL", "TINKER_API_KEY", "TINKER_CREDENTIAL_CMD"):
        monkeypatch.delenv(var, raising=False)
    unpatch_sdk(monkeypatch)


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
    sdk = sdk_sampling._attach_sequence_ids
    with pytest.raises(AssertionError, match="sample_sequence_ids"):  # the SDK's own, for Thinking Machines'
        sdk(response, None)
    tolerant = tolerate_missing_ids(sdk)
    assert tolerant(response, None) is response
    numbered = tolerant(response, ["a", "b"])
    assert [s.sequence_id for s in numbered.sequences] == ["a", "b"]
    assert numbered == sdk(response, ["a", "b"])
    with pytest.raises(AssertionError, match="1 sequence ids for 2 sequences"):
        tolerant(response, ["a"])
    assert tolerate_missing_ids(tolerant) is tolerant  # wrapped once


def test_a_client_for_another_server_tolerates_missing_ids_and_one_for_thinking_machines_does_not(monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", "tml-mine")
    sdk = sdk_sampling._attach_sequence_ids
    service_client()  # no request is made until a method is called
    assert sdk_sampling._attach_sequence_ids is sdk
    monkeypatch.setenv("TINKER_BASE_URL", "http://127.0.0.1:9")
    client = service_client()
    assert sdk_sampling._attach_sequence_ids.__wrapped__ is sdk
    assert isinstance(client, tinker.ServiceClient)


#: What SkyRL's server answers a forward_backward with loss_fn "dro" (HTTP 422), shortened.
DRO_REFUSED = {"detail": [{"type": "literal_error", "loc": ["forward_backward_input", "loss_fn"], "input": "dro",
                           "msg": "Input should be 'cross_entropy', 'importance_sampling' or 'ppo'",
                           "ctx": {"expected": "'cross_entropy', 'importance_sampling' or 'ppo'"}}]}


def test_refusals_are_one_line(monkeypatch):
    monkeypatch.setenv("TINKER_BASE_URL", "http://127.0.0.1:8000")
    assert refusal(422, DRO_REFUSED) == (
        "the Tinker service at http://127.0.0.1:8000 does not offer loss_fn 'dro' (HTTP 422); it offers "
        "'cross_entropy', 'importance_sampling' or 'ppo': set training.loss_fn to one of those and run again "
        "(--resume continues a started run)")
    assert refusal(400, {"detail": "Model model_1 not loaded (likely stale request from previous server)"}) == (
        "the Tinker service at http://127.0.0.1:8000 refused a request (HTTP 400): Model model_1 not loaded "
        "(likely stale request from previous server): it was restarted or dropped this run's model; continue with "
        "--resume")
    assert refusal(404, "no\nsuch   thing") == ("the Tinker service at http://127.0.0.1:8000 refused a request "
                                                "(HTTP 404): no such thing")
    assert refusal(500, {"detail": "boom"}) is None and refusal(None, "x") is None
    assert refusal(400, {"detail": []}) is None


class _Refused(Exception):
    def __init__(self, status_code, body):
        super().__init__(f"Error code: {status_code}")
        self.status_code, self.body = status_code, body


def test_the_outage_clock_stops_a_request_once_nothing_has_answered_for_its_limit(monkeypatch):
    monkeypatch.setenv("TINKER_BASE_URL", "http://127.0.0.1:8000")
    now = [0.0]
    clock = OutageClock(5.0, clock=lambda: now[0])
    outcomes = []

    async def request(client, *args, **kwargs):
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    bounded = clock.wrap(request, (ConnectionRefusedError,), (_Refused,))
    call = lambda: asyncio.run(bounded(None))  # noqa: E731
    outcomes[:] = [ConnectionRefusedError("refused"), ConnectionRefusedError("refused"), "ok",
                   ConnectionRefusedError("refused"), ConnectionRefusedError("refused")]
    with pytest.raises(ConnectionRefusedError):  # the first failure: the SDK retries it
        call()
    now[0] = 4.9
    with pytest.raises(ConnectionRefusedError):
        call()
    assert call() == "ok"  # an answer: the clock starts again at the next failure
    now[0] = 9.0
    with pytest.raises(ConnectionRefusedError):
        call()
    now[0] = 14.0
    with pytest.raises(TinkerUnreachable, match=r"^the Tinker service at http://127.0.0.1:8000 has not answered "
                                                r"for 5 s \(ConnectionRefusedError: refused\); is it running\?"):
        call()
    assert isinstance(TinkerUnreachable("x"), ConnectionError)  # a service fault, which the SDK does not retry
    outcomes[:] = [_Refused(422, DRO_REFUSED), _Refused(404, {"detail": "nope"})]
    with pytest.raises(TinkerRefused, match="does not offer loss_fn 'dro'"):
        call()
    with pytest.raises(_Refused):  # another refusal stays the SDK's to retry or report
        call()


@pytest.mark.parametrize("value", ["soon", "0", "-3"])
def test_the_outage_limit_must_be_positive_seconds(monkeypatch, value):
    monkeypatch.setenv("SAILRL_TINKER_UNREACHABLE_S", value)
    with pytest.raises(ConfigError, match="SAILRL_TINKER_UNREACHABLE_S must be a positive number of seconds"):
        unreachable_s()


def test_service_client_bounds_every_request_once(monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", "tml-mine")
    sdk_request = AsyncAPIClient.request
    service_client()
    bounded = AsyncAPIClient.request
    assert bounded is not sdk_request and bounded.__sailrl_outage_clock__.limit_s == 300.0
    monkeypatch.setenv("SAILRL_TINKER_UNREACHABLE_S", "7")
    service_client()
    assert AsyncAPIClient.request is bounded and bounded.__sailrl_outage_clock__.limit_s == 7.0
    assert _APIFuture._handle_transport_error.__sailrl_refusals__


@pytest.mark.slow
def test_another_server_unreachable_at_start_is_one_line_with_no_key_set(tmp_path, monkeypatch, capsys):
    from sailrl.cli import main

    monkeypatch.setenv("TINKER_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("SAILRL_CONNECT_TIMEOUT_S", "2")
    spec = Path(__file__).resolve().parents[2] / "spec/examples/quickstart.yaml"
    code = main(["run", str(spec), "--sampler", "tinker", "--set", f"output.run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err and "TINKER_API_KEY" not in err
    assert err.strip().splitlines()[-1].startswith(
        "error: Tinker did not answer within 2 s (http://127.0.0.1:9): check TINKER_BASE_URL")
    assert not (tmp_path / "run").exists()
