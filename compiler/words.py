"""The reward in plain words, as ``sailrl explain`` prints it, for the compiled script's comment.

In the validation stage (it reads the runtime's reward rule engine, which the rendering stage may not import):
``sailrl compile`` and ``sailrl run`` pass :func:`reward_words` to :func:`sailrl.compiler.render.render_script`.
"""

from __future__ import annotations

from sailrl.runtime.rewards import RewardFunction
from sailrl.spec.schema import Spec


def reward_words(spec: Spec) -> list[str]:
    """One sentence per reward rule, then the total and what 'correct' means (``RewardFunction.explain``, what
    ``sailrl explain`` prints); with ``environment:``, the episode's sentences after them (what it prints under
    "Episodes:")."""
    words = RewardFunction.from_spec(spec.reward, spec.prompt.reference_field).explain()
    if spec.environment is not None:
        words += spec.environment.describe()
    return words
