"""tinker_cookbook's RL functions run unchanged against the embedded backend."""

from __future__ import annotations

import asyncio
import math

import pytest
import tinker
import torch
from tinker_cookbook.completers import TinkerTokenCompleter
from tinker_cookbook.rl.data_processing import assemble_training_data, compute_advantages
from tinker_cookbook.rl.rollouts import do_group_rollout
from tinker_cookbook.rl.train import train_step
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, StepResult

from sailrl.runtime.backends.local import LocalServiceClient
from sailrl.runtime.backends.models import get_renderer

GROUP_SIZE = 4
NUM_GROUPS = 3


class DigitsEnv(Env):
    """One turn: "a+b=?"; reward = fraction of the reply's characters that are digits (varies a lot
    between random samples, so advantages are not all zero)."""

    def __init__(self, a: int, b: int, renderer):
        self.a, self.b, self.renderer = a, b, renderer

    async def initial_observation(self):
        prompt = self.renderer.build_generation_prompt([{"role": "user", "content": f"{self.a}+{self.b}=?"}])
        return prompt, self.renderer.get_stop_sequences()

    async def step(self, action, *, extra=None):
        message, _ = self.renderer.parse_response(action)
        text = message["content"]
        reward = sum(c.isdigit() for c in text) / max(len(text), 1)
        return StepResult(
            reward=reward,
            episode_done=True,
            next_observation=tinker.ModelInput.from_ints([]),
            next_stop_condition=[],
        )


class DigitsGroupBuilder(EnvGroupBuilder):
    def __init__(self, a: int, b: int, renderer):
        self.a, self.b, self.renderer = a, b, renderer

    async def make_envs(self):
        return [DigitsEnv(self.a, self.b, self.renderer) for _ in range(GROUP_SIZE)]

    def logging_tags(self):
        return ["digits"]


def _trainable(tc) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in tc.peft_model.named_parameters() if p.requires_grad}


def _without_mask(datum: tinker.Datum) -> tinker.Datum:
    return tinker.Datum(
        model_input=datum.model_input,
        loss_fn_inputs={k: v for k, v in datum.loss_fn_inputs.items() if k != "mask"},
    )


@pytest.fixture(scope="module")
def rl_step(tmp_path_factory):
    """One full RL step: rollouts -> advantages -> datums -> train_step, plus the pieces to check."""

    async def run():
        svc = LocalServiceClient(base_dir=tmp_path_factory.mktemp("ckpt"), seed=0)
        tc = await svc.create_lora_training_client_async("sailrl/tiny", rank=8, seed=3)
        renderer = get_renderer("role_colon", tc.get_tokenizer())
        sampler = await tc.save_weights_and_get_sampling_client_async()
        policy = TinkerTokenCompleter(sampler, max_tokens=12, temperature=1.0)
        builders = [DigitsGroupBuilder(a, a + 1, renderer) for a in range(NUM_GROUPS)]
        groups = await asyncio.gather(*[do_group_rollout(b, policy) for b in builders])
        advantages = compute_advantages(groups)
        data, _metadata = assemble_training_data(groups, advantages)
        clean = [_without_mask(d) for d in data]
        before_fwd = await (await tc.forward_async(clean, "importance_sampling")).result_async()
        before = _trainable(tc)
        metrics: dict = {}
        train_logprobs = await train_step(
            data, tc, learning_rate=1e-3, num_substeps=2, loss_fn="importance_sampling", metrics=metrics
        )
        after = _trainable(tc)
        after_fwd = await tc.forward(clean, "importance_sampling")
        return {
            "tc": tc,
            "sampler": sampler,
            "groups": groups,
            "advantages": advantages,
            "data": data,
            "before_fwd": before_fwd,
            "after_fwd": after_fwd,
            "before": before,
            "after": after,
            "metrics": metrics,
            "train_logprobs": train_logprobs,
        }

    return asyncio.run(run())


def test_rollouts_are_coalesced_into_one_batch(rl_step):
    # every sample_async(num_samples=1) of all groups, gathered together, became ONE generation
    assert rl_step["sampler"]._batcher.batch_sizes == [GROUP_SIZE * NUM_GROUPS]
    assert [len(g.trajectories_G) for g in rl_step["groups"]] == [GROUP_SIZE] * NUM_GROUPS


def test_advantages_are_group_centered(rl_step):
    for group, adv in zip(rl_step["groups"], rl_step["advantages"], strict=True):
        rewards = torch.tensor(group.get_total_rewards())
        assert torch.allclose(adv, rewards - rewards.mean())
        assert abs(float(adv.sum())) < 1e-6
    assert any(float(a.abs().max()) > 0 for a in rl_step["advantages"]), "all groups degenerate"


def test_sampled_logprobs_match_training_logprobs_on_policy(rl_step):
    # temperature 1, same weights: the learner's logprobs equal the sampler's (importance ratio 1)
    for datum, out in zip(rl_step["data"], rl_step["before_fwd"].loss_fn_outputs, strict=True):
        mask = datum.loss_fn_inputs["mask"].to_torch() > 0
        sampled = datum.loss_fn_inputs["logprobs"].to_torch()[mask]
        learner = out["logprobs"].to_torch()[mask]
        assert mask.sum() > 0
        assert torch.allclose(sampled, learner, atol=2e-5), (sampled - learner).abs().max()


def test_sampled_logprobs_match_compute_logprobs(rl_step):
    traj = rl_step["groups"][0].trajectories_G[0]
    transition = traj.transitions[0]
    prompt = transition.ob.to_ints()
    full = tinker.ModelInput.from_ints(prompt + transition.ac.tokens)
    recomputed = rl_step["sampler"].compute_logprobs(full).result()
    assert recomputed[0] is None
    got = torch.tensor(recomputed[len(prompt) :])
    assert torch.allclose(got, torch.tensor(transition.ac.logprobs), atol=2e-5)


def test_train_step_changes_weights_and_improves_the_surrogate(rl_step):
    changed = [n for n in rl_step["before"] if not torch.equal(rl_step["before"][n], rl_step["after"][n])]
    assert changed and all("lora_" in n for n in changed)
    assert len(rl_step["train_logprobs"]) == len(rl_step["data"])
    assert math.isfinite(rl_step["metrics"]["grad_norm"]) and rl_step["metrics"]["grad_norm"] > 0
    loss_before = rl_step["before_fwd"].metrics["loss:sum"]
    loss_after = rl_step["after_fwd"].metrics["loss:sum"]
    assert math.isfinite(loss_before) and math.isfinite(loss_after)
    # on-policy the IS loss is -sum(A) over action tokens; two Adam steps along its gradient lower it
    expected_before = -sum(float((d.loss_fn_inputs["advantages"].to_torch()).sum()) for d in rl_step["data"])
    assert loss_before == pytest.approx(expected_before, abs=1e-3)
    assert loss_after < loss_before
