"""Direct preference optimisation (``method: dpo``): pairs of a chosen and a rejected completion per prompt, the
frozen reference model's logprobs of each, the DPO loss through ``forward_backward_custom``, and the run a
generated DPO script drives (``run.pairs``, ``run.reference``, ``run.records``, ``run.checkpoints``)."""
