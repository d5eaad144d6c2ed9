"""The reward in plain words, as ``sailrl explain`` prints it, for the compiled script's comment.

In the validation stage (it reads the runtime's reward rule engine, which the rendering stage may not import):
``sailrl compile`` and ``sailrl run`` pass :func:`reward_words` to :func:`sailrl.compiler.render.render_script`.
"""

from __future__ import annotations

from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.spec.schema import Spec


def reward_words(spec: Spec) -> list[str]:
    """One sentence per reward rule, then the total and what 'correct' means (``RewardFunction.explain``, what
    ``sailrl explain`` prints); with ``environment:``, the episode's sentences after them (what it prints under
    "Episodes:")."""
    if spec.reward is None:
        return []  # a method without reward rules (sft, dpo, distill from the teacher alone)
    reference = spec.prompt.reference_field if spec.prompt is not None else "answer"
    words = RewardFunction.from_spec(spec.reward, reference).explain()
    if spec.environment is not None:
        words += spec.environment.describe()
    return words
