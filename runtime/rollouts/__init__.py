"""Rollouts: a single-turn group over the reward rules (``rollout``) and multi-turn episodes with tools and
feedback (``episode``), as tinker_cookbook ``Env`` / ``EnvGroupBuilder``.
"""
