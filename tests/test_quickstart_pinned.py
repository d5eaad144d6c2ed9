"""The quickstart's hyperparameters are tuned for the embedded backend's random tiny model; pin them.

Measured with these values (2 cores): mean reward of the first 5 RL steps 0.273 -> last 5 0.505 in 66 s
(`sailrl run spec/examples/quickstart.yaml`); .ci/run re-checks the climb on every submission. Shorter warm-up
(60 steps) never learns the answer format (reward flat near 0.02); a 400-step warm-up learns it fully and
leaves RL nothing to do (0.53 -> 0.54). `sailrl init`'s starter must train the same way.
"""

from __future__ import annotations

from pathlib import Path

from sailrl.spec.loader import load_spec

ROOT = Path(__file__).resolve().parent.parent


def test_quickstart_values_are_the_measured_ones():
    s = load_spec(ROOT / "spec/examples/quickstart.yaml").spec
    t = s.training
    assert (s.model.name, s.model.renderer, s.model.lora_rank) == ("sailrl/tiny", "role_colon", 16)
    assert (t.steps, t.group_size, t.groups_per_step, t.learning_rate, t.loss_fn) == (
        40, 8, 16, 1e-3, "importance_sampling")
    assert (t.warmup.steps, t.warmup.batch_size, t.warmup.learning_rate) == (150, 32, 1e-2)
    assert (s.sampling.sampler, s.sampling.max_tokens, s.sampling.temperature) == ("local", 12, 1.0)


def test_the_starter_spec_trains_like_the_quickstart(tmp_path):
    from sailrl.cli import main

    assert main(["init", str(tmp_path / "spec.yaml")]) == 0
    quick = load_spec(ROOT / "spec/examples/quickstart.yaml").spec
    starter = load_spec(tmp_path / "spec.yaml").spec
    from sailrl.spec.renderers import default_renderer

    def resolved_model(spec):
        return spec.model.model_copy(update={"renderer": spec.model.renderer or default_renderer(spec.model.name)})

    assert resolved_model(starter) == resolved_model(quick)
    for section in ("prompt", "reward", "training", "sampling"):
        assert getattr(starter, section) == getattr(quick, section), section
    assert Path(starter.dataset.source).name == Path(quick.dataset.source).name
