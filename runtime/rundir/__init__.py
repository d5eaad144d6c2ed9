"""The run directory: one home per format (``directory``: file names, records, the bounded reader), the
rollout log (``rollout_log``), the embedded backend's checkpoints run by run (``checkpoint_store``), disk failures
(``writes``).
"""
