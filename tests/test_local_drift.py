"""The local clients cannot drift from the installed tinker SDK: same method names, parameters, kinds.

If tinker renames a method or parameter that sailrl's loop calls, this fails in CI instead of in a
user's paid run.
"""

from __future__ import annotations

import inspect
import re
import tomllib
from pathlib import Path

import pytest
import tinker
from packaging.requirements import Requirement
from tinker.lib.public_interfaces.rest_client import RestClient

from sailrl.runtime.local import service
from sailrl.runtime.local.rest import LocalRestClient
from sailrl.runtime.local.sampling import LocalSamplingClient
from sailrl.runtime.local.service import LocalServiceClient
from sailrl.runtime.local.training import LocalTrainingClient

PAIRS = [
    (LocalServiceClient, tinker.ServiceClient),
    (LocalTrainingClient, tinker.TrainingClient),
    (LocalSamplingClient, tinker.SamplingClient),
    (LocalRestClient, RestClient),
]

# what sailrl's loop, tinker_cookbook's RL functions and sail's checkpoint URL helper call
REQUIRED = {
    LocalServiceClient: [
        "create_lora_training_client",
        "create_lora_training_client_async",
        "create_training_client_from_state",
        "create_training_client_from_state_async",
        "create_training_client_from_state_with_optimizer",
        "create_training_client_from_state_with_optimizer_async",
        "create_sampling_client",
        "create_sampling_client_async",
        "create_rest_client",
        "get_server_capabilities",
        "get_server_capabilities_async",
    ],
    LocalTrainingClient: [
        "forward",
        "forward_async",
        "forward_backward",
        "forward_backward_async",
        "optim_step",
        "optim_step_async",
        "save_state",
        "save_state_async",
        "load_state",
        "load_state_async",
        "load_state_with_optimizer",
        "load_state_with_optimizer_async",
        "save_weights_for_sampler",
        "save_weights_for_sampler_async",
        "save_weights_and_get_sampling_client",
        "save_weights_and_get_sampling_client_async",
        "create_sampling_client",
        "create_sampling_client_async",
        "get_tokenizer",
        "get_info",
    ],
    LocalSamplingClient: [
        "sample",
        "sample_async",
        "compute_logprobs",
        "compute_logprobs_async",
        "get_tokenizer",
        "get_base_model",
    ],
    LocalRestClient: [
        "set_checkpoint_ttl_from_tinker_path",
        "set_checkpoint_ttl_from_tinker_path_async",
        "delete_checkpoint_from_tinker_path",
        "list_checkpoints",
    ],
}

# ours, deliberately absent from tinker 0.38 (sail 0.17 asks for them; see runtime/local/rest.py)
NOT_IN_SDK = {
    "get_checkpoint_archive_url_from_tinker_path",
    "get_checkpoint_archive_url_from_tinker_path_async",
    "peft_model",
    "expect_requests",
}


def _public_methods(cls) -> list[str]:
    return sorted(n for n, v in vars(cls).items() if not n.startswith("_") and callable(v))


def _params(fn) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]


@pytest.mark.parametrize(("local", "sdk"), PAIRS, ids=lambda c: c.__name__)
def test_required_methods_exist_in_both(local, sdk):
    for name in REQUIRED[local]:
        assert hasattr(sdk, name), f"tinker.{sdk.__name__}.{name} is gone: the SDK changed"
        assert callable(getattr(local, name, None)), f"{local.__name__}.{name} is missing"


@pytest.mark.parametrize(("local", "sdk"), PAIRS, ids=lambda c: c.__name__)
def test_signatures_match_the_sdk(local, sdk):
    checked = 0
    for name in _public_methods(local):
        if not hasattr(sdk, name):
            assert name in NOT_IN_SDK, f"{local.__name__}.{name} has no counterpart in tinker.{sdk.__name__}"
            continue
        ours, theirs = getattr(local, name), getattr(sdk, name)
        sdk_params = _params(theirs)
        our_params = {p.name: p for p in _params(ours)}
        for p in sdk_params:
            assert p.name in our_params, f"{local.__name__}.{name} lacks parameter {p.name!r}"
            assert our_params[p.name].kind == p.kind, f"{local.__name__}.{name}({p.name}) kind differs"
            assert (our_params[p.name].default is inspect.Parameter.empty) == (
                p.default is inspect.Parameter.empty
            ), f"{local.__name__}.{name}({p.name}) required-ness differs"
        positional = [p.name for p in sdk_params if p.kind is not inspect.Parameter.KEYWORD_ONLY]
        ours_positional = [p.name for p in _params(ours) if p.kind is not inspect.Parameter.KEYWORD_ONLY]
        assert ours_positional[: len(positional)] == positional, f"{local.__name__}.{name} positional order"
        assert inspect.iscoroutinefunction(ours) == inspect.iscoroutinefunction(inspect.unwrap(theirs)), (
            f"{local.__name__}.{name}: async-ness differs from the SDK"
        )
        checked += 1
    assert checked >= len(REQUIRED[local])


def test_the_tinker_release_the_local_service_names_is_inside_pyprojects_pin():
    root = Path(__file__).resolve().parent.parent
    deps = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    (pin,) = [Requirement(d).specifier for d in deps if Requirement(d).name == "tinker"]
    named = re.findall(r"follow tinker (\d+\.\d+)", " ".join(service.__doc__.split()))
    assert named == ["0.35"]
    assert pin.contains(f"{named[0]}.0"), (named, str(pin))
