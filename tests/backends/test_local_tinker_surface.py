"""The embedded backend as ``tinker``'s own classes: the SDK constructor's arguments, the clients themselves from
the creation methods (instances of the SDK classes), the rest client's training-run calls returning
``tinker.types``, and the refusals the service makes (``load_state`` only as a client's first request; a training
state is not a sampler checkpoint, nor the other way round)."""

from __future__ import annotations

import asyncio

import pytest
import tinker
from tinker import types
from tinker.lib.public_interfaces.rest_client import RestClient

from sailrl.runtime.backends.local import CheckpointPathError, LocalServiceClient

SEQ = [72, 101, 108, 108, 111, 35, 50, 43, 51, 61]
DATUM = types.Datum(model_input=types.ModelInput.from_ints(SEQ[:-1]), loss_fn_inputs={"target_tokens": SEQ[1:]})


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    service = LocalServiceClient(base_url=None, user_metadata={"recipe": "test"}, display_name="surface",
                                 base_dir=tmp_path_factory.mktemp("ckpt"), seed=0)
    yield service
    service.close("success")


@pytest.fixture(scope="module")
def saved(svc):
    """A client that trained one step and saved both kinds of checkpoint."""
    tc = svc.create_lora_training_client("sailrl/tiny", rank=4, seed=1, user_metadata={"renderer_name": "role_colon"})
    tc.forward_backward([DATUM], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    return tc, tc.save_state("s1").result().path, tc.save_weights_for_sampler("s1").result().path


def test_the_constructor_takes_the_sdk_arguments_a_recipe_passes(tmp_path):
    with pytest.warns(FutureWarning, match="ignores unsupported arguments: bogus"):
        service = LocalServiceClient(base_url="http://unused", user_metadata={"a": "b"}, project_id="p",
                                     display_name="d", api_key="k", default_headers_overrides={"x": "y"},
                                     base_dir=tmp_path, bogus=1)
    assert service.user_metadata == {"a": "b"} and service.display_name == "d"
    service.close("success")


def test_creation_methods_return_instances_of_the_sdk_classes(svc, saved):
    tc, state, sampler_path = saved
    assert isinstance(svc, tinker.ServiceClient)
    assert isinstance(tc, tinker.TrainingClient)
    assert isinstance(svc.create_sampling_client(model_path=sampler_path), tinker.SamplingClient)
    assert isinstance(svc.create_sampling_client(base_model="sailrl/tiny"), tinker.SamplingClient)
    assert isinstance(tc.save_weights_and_get_sampling_client(), tinker.SamplingClient)
    assert isinstance(tc.create_sampling_client(sampler_path), tinker.SamplingClient)
    assert isinstance(svc.create_training_client_from_state(state), tinker.TrainingClient)
    assert isinstance(svc.create_training_client_from_state_with_optimizer(state), tinker.TrainingClient)
    assert isinstance(svc.create_rest_client(), RestClient)
    async def created():
        return (await svc.create_lora_training_client_async("sailrl/tiny", rank=2),
                await svc.create_sampling_client_async(model_path=sampler_path))
    a, b = asyncio.run(created())
    assert isinstance(a, tinker.TrainingClient) and isinstance(b, tinker.SamplingClient)


def test_get_training_run_by_tinker_path_returns_the_runs_metadata(svc, saved):
    tc, state, sampler_path = saved
    rest = svc.create_rest_client()
    run = rest.get_training_run_by_tinker_path(state).result()
    assert isinstance(run, types.TrainingRun)
    assert (run.training_run_id, run.base_model, run.is_lora, run.lora_rank, run.user_metadata) == (
        tc.model_id, "sailrl/tiny", True, 4, {"renderer_name": "role_colon"})
    assert run.last_checkpoint.tinker_path == state and run.last_sampler_checkpoint.tinker_path == sampler_path
    assert asyncio.run(rest.get_training_run_by_tinker_path_async(sampler_path)) == run
    assert rest.get_training_run(tc.model_id).result() == run
    assert asyncio.run(rest.get_training_run_async(tc.model_id)) == run
    with pytest.raises(ValueError, match="not an embedded-backend checkpoint path"):
        rest.get_training_run_by_tinker_path("tinker://x/weights/y")
    with pytest.raises(CheckpointPathError, match="No training run 'nope'"):
        rest.get_training_run("nope").result()


def test_a_run_made_from_a_state_records_its_own_user_metadata(svc, saved):
    _, state, _ = saved
    resumed = svc.create_training_client_from_state_with_optimizer(state, user_metadata={"renderer_name": "r2"})
    run = svc.create_rest_client().get_training_run(resumed.model_id).result()
    assert run.user_metadata == {"renderer_name": "r2"} and run.lora_rank == 4 and run.last_checkpoint is None


def test_list_training_runs_and_user_checkpoints_page_newest_first(tmp_path):
    service = LocalServiceClient(base_dir=tmp_path, seed=0)
    first = service.create_lora_training_client("sailrl/tiny", rank=2, seed=1)
    p1 = first.save_state("a").result().path
    second = service.create_lora_training_client("sailrl/tiny", rank=2, seed=2)
    p2 = second.save_weights_for_sampler("b").result().path
    p3 = second.save_state("c").result().path
    rest = service.create_rest_client()
    runs = rest.list_training_runs().result()
    assert isinstance(runs, types.TrainingRunsResponse)
    assert [r.training_run_id for r in runs.training_runs] == [second.model_id, first.model_id]
    assert runs.cursor == types.Cursor(offset=0, limit=20, total_count=2)
    page = asyncio.run(rest.list_training_runs_async(limit=1, offset=1))
    assert [r.training_run_id for r in page.training_runs] == [first.model_id] and page.cursor.total_count == 2
    listed = rest.list_user_checkpoints().result()
    assert isinstance(listed, types.CheckpointsListResponse)
    assert [c.tinker_path for c in listed.checkpoints] == [p3, p2, p1]
    assert listed.cursor == types.Cursor(offset=0, limit=100, total_count=3)
    page = asyncio.run(rest.list_user_checkpoints_async(limit=2, offset=1))
    assert [c.tinker_path for c in page.checkpoints] == [p2, p1]
    service.close("success")


def test_load_state_is_refused_after_the_client_trained(svc, saved):
    tc, state, _ = saved
    with pytest.raises(ValueError) as err:
        tc.load_state(state).result()
    assert str(err.value) == (
        f"load_state must be a training client's first request, and this client ({tc.model_id}) has already made "
        f"forward_backward: create a new training client from the checkpoint instead "
        f"(ServiceClient.create_training_client_from_state_with_optimizer({state!r}), or "
        f"create_training_client_from_state for the weights alone).")
    with pytest.raises(ValueError, match="first request"):
        tc.load_state_with_optimizer(state).result()
    # a client made from a state has made its load: a second one is refused too
    made = svc.create_training_client_from_state(state)
    with pytest.raises(ValueError, match=r"has already made load_state\('local://"):
        asyncio.run(_load(made, state))
    # as its first request it loads
    fresh = svc.create_lora_training_client("sailrl/tiny", rank=4, seed=9)
    assert fresh.load_state(state).result().path == state


async def _load(client, path):
    return await (await client.load_state_async(path)).result_async()


def test_a_state_path_is_not_a_sampler_path_nor_the_other_way_round(svc, saved):
    tc, state, sampler_path = saved
    run = tc.model_id
    with pytest.raises(CheckpointPathError) as err:
        svc.create_sampling_client(model_path=state)
    assert str(err.value) == (
        f"A sampling client needs a sampler checkpoint (sampler_weights/, written by save_weights_for_sampler), but "
        f"{state} is a training-state checkpoint (weights/, written by save_state); pass "
        f"local://{run}/sampler_weights/<name> instead.")
    with pytest.raises(CheckpointPathError, match="A sampling client needs a sampler checkpoint"):
        tc.create_sampling_client(state)
    with pytest.raises(CheckpointPathError) as err:
        svc.create_training_client_from_state(sampler_path)
    assert str(err.value) == (
        f"create_training_client_from_state needs a training-state checkpoint (weights/, written by save_state), but "
        f"{sampler_path} is a sampler checkpoint (sampler_weights/, written by save_weights_for_sampler); pass "
        f"local://{run}/weights/<name> instead.")
    with pytest.raises(CheckpointPathError, match="needs a training-state checkpoint"):
        svc.create_training_client_from_state_with_optimizer(sampler_path)
    fresh = svc.create_lora_training_client("sailrl/tiny", rank=4, seed=9)
    with pytest.raises(CheckpointPathError, match="load_state needs a training-state checkpoint"):
        fresh.load_state(sampler_path).result()
