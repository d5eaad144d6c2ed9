"""The reward rules: the engine that scores a completion (``rules.RewardFunction``), answer extraction and
comparison (``answers``), python rules (``python_rules``), judge rules (``judge``), a step's scoring in threads
(``scoring``). The validation stage imports this package.
"""
