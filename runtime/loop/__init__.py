"""The parts of a run the generated script's ``main()`` calls (``run.sampler``, ``run.rewards``, ``run.records``,
``run.checkpoints``, ``run.budget``, ``run.warmup``), how a run opens (``opening``), its errors, its console and
report, the collapse and gaming watches, and the learning-rate schedule.
"""
