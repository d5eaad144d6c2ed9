"""Two stages in one folder: validation (``validate``: the entry point; ``checks``, ``reward_checks``,
``cost_checks``) and rendering (``render``; ``docgen`` writes the docs generated from the spec's tables)."""
