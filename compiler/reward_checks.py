"""Checks of a spec's reward rules against its worked ``examples:`` (run by ``sailrl validate``).

Placeholder: the full implementation follows shortly; the signature is stable.
"""

from __future__ import annotations

from typing import Any


def check_reward_examples(loaded: Any) -> list:
    """Score every ``examples:`` entry of ``loaded.spec`` and return one SpecError per disagreement."""
    return []
