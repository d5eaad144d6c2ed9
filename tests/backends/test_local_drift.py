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

from sailrl.runtime.backends.local import service
from sailrl.runtime.backends.local.rest import LocalRestClient
from sailrl.runtime.backends.local.sampling import LocalSamplingClient
from sailrl.runtime.backends.local.service import LocalServiceClient
from sailrl.runtime.backends.local.training import LocalTrainingClient

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
        "delete_checkpoint_from_tinker_path_async",
        "list_checkpoints",
        "get_training_run",
        "get_training_run_async",
        "get_training_run_by_tinker_path",
        "get_training_run_by_tinker_path_async",
        "list_training_runs",
        "list_training_runs_async",
        "list_user_checkpoints",
        "list_user_checkpoints_async",
    ],
}

# what tinker-cookbook 0.5.8's recipes call beyond REQUIRED (recipes/rl_loop.py, recipes/sl_loop.py, rl/train.py,
# supervised/train.py, checkpoint_utils, preference/train_dpo.py, distillation/sdft.py)
COOKBOOK = {
    LocalServiceClient: ["create_sampling_client", "create_rest_client"],
    LocalTrainingClient: ["forward_backward_custom", "forward_backward_custom_async", "get_info_async",
                          "save_weights_and_get_sampling_client", "optim_step", "forward_backward"],
    LocalSamplingClient: ["sample", "sample_async", "compute_logprobs_async"],
    LocalRestClient: ["get_training_run_by_tinker_path", "get_training_run_by_tinker_path_async",
                      "delete_checkpoint_from_tinker_path_async"],
}

# ours, deliberately absent from tinker 0.38 (sail 0.17 asks for them; see runtime/backends/local/rest.py)
NOT_IN_SDK = {
    "get_checkpoint_archive_url_from_tinker_path",
    "get_checkpoint_archive_url_from_tinker_path_async",
    "peft_model",
    "expect_requests",
}


def _public_methods(cls) -> list[str]:
    """The public methods ``cls`` defines itself or takes from a sailrl base (a mixin), not the SDK's."""
    own = [c for c in cls.__mro__ if c.__module__.startswith("sailrl.")]
    return sorted({n for c in own for n, v in vars(c).items() if not n.startswith("_") and callable(v)})


def _params(fn) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]


@pytest.mark.parametrize(("local", "sdk"), PAIRS, ids=lambda c: c.__name__)
def test_required_methods_exist_in_both(local, sdk):
    for name in REQUIRED[local] + COOKBOOK[local]:
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


@pytest.mark.parametrize(("local", "sdk"), PAIRS, ids=lambda c: c.__name__)
def test_each_local_client_is_an_instance_of_its_sdk_class(local, sdk):
    assert issubclass(local, sdk)


@pytest.mark.parametrize(("local", "sdk"), PAIRS, ids=lambda c: c.__name__)
def test_every_public_sdk_method_is_implemented_or_refused_by_name(local, sdk):
    """A method the SDK has and the local client does not implement raises NotImplementedError naming it (an
    inherited SDK method would fail inside the SDK on a missing server connection instead)."""
    def unwrapped(value):
        if isinstance(value, property):
            return value.fget
        return value.__func__ if isinstance(value, (staticmethod, classmethod)) else value

    refused = []
    for name in (n for n in dir(sdk) if not n.startswith("_")):
        ours = unwrapped(inspect.getattr_static(local, name))
        assert ours is not unwrapped(inspect.getattr_static(sdk, name)), f"{local.__name__}.{name} is the SDK's own"
        if hasattr(ours, "refuses"):
            assert ours.refuses == f"{sdk.__name__}.{name}"
            refused.append(name)
    implemented = set(REQUIRED[local] + COOKBOOK[local])
    assert not implemented & set(refused), implemented & set(refused)


def test_an_unimplemented_sdk_method_says_which_and_why():
    client = object.__new__(LocalTrainingClient)
    with pytest.raises(NotImplementedError, match=r"does not implement TrainingClient\.save_weights_external"):
        client.save_weights_external("x")
    with pytest.raises(AttributeError, match=r"does not implement ServiceClient\.holder"):
        object.__new__(LocalServiceClient).holder


def test_the_service_client_takes_every_argument_of_the_sdk_constructor():
    """tinker_cookbook's recipes build ``tinker.ServiceClient(base_url=..., user_metadata=..., display_name=...)``;
    with LocalServiceClient in its place each of the SDK's constructor arguments is accepted by name."""
    ours = inspect.signature(LocalServiceClient.__init__).parameters
    for p in _params(tinker.ServiceClient.__init__):
        assert p.name in ours, f"LocalServiceClient() lacks the SDK's argument {p.name!r}"
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            assert ours[p.name].kind is inspect.Parameter.VAR_KEYWORD
        else:
            assert ours[p.name].default is not inspect.Parameter.empty


def test_the_tinker_release_the_local_service_names_is_inside_pyprojects_pin():
    root = Path(__file__).resolve().parents[2]
    deps = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    (pin,) = [Requirement(d).specifier for d in deps if Requirement(d).name == "tinker"]
    named = re.findall(r"follow tinker (\d+\.\d+)", " ".join(service.__doc__.split()))
    assert named == ["0.35"]
    assert pin.contains(f"{named[0]}.0"), (named, str(pin))
