"""Which rows an RL step draws beyond its plain share of the data order: dynamic sampling and the difficulty filter.

``training.dynamic_sampling`` (DAPO's dynamic sampling): a step keeps drawing groups from the next rows of the data
order until it has ``groups_per_step`` groups with signal (not every rollout of the group scored the same), at most
``max_extra_groups`` groups more than ``groups_per_step``. ``training.difficulty_filter``: a row whose group was
degenerate (all right or all wrong: every rollout scored the same) the last ``degenerate_draws`` times it was drawn
rests, skipped by the data order, for ``rest_steps`` steps (``null``: the rest of the run). The runtime side is
:mod:`sailrl.runtime.data.draws`.
"""

from __future__ import annotations

from pydantic import Field

from sailrl.spec.base import SpecModel, usual_range


class DynamicSamplingSpec(SpecModel):
    """Draw more groups until the step has ``groups_per_step`` groups with signal (DAPO's dynamic sampling)."""

    max_extra_groups: int = Field(
        description=(
            "The most groups a step may draw beyond groups_per_step, from the next rows of the data order, while "
            "fewer than groups_per_step of its groups have signal (not every rollout scored the same). The cost "
            "estimate counts every step drawing all of them (its upper bound)."
        ),
        gt=0, le=65_536, json_schema_extra=usual_range(1, 256),
    )


class DifficultyFilterSpec(SpecModel):
    """Rest rows that keep giving degenerate groups (all right or all wrong), so steps draw rows that teach."""

    degenerate_draws: int = Field(
        2, gt=0, le=1000,
        description=(
            "A row rests once its group was degenerate (every rollout scored the same: all right or all wrong) "
            "this many times in a row that it was drawn; a draw with signal starts the count again."
        ),
    )
    rest_steps: int | None = Field(
        None, gt=0, le=1_000_000,
        description=(
            "Steps a rested row is skipped by the data order, from the step after it was rested; null: the rest of "
            "the run. A row is not rested when that would leave fewer than groups_per_step rows to draw from."
        ),
    )
