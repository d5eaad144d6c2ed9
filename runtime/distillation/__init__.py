"""On-policy distillation (``method: distill``): the teacher a run opens next to its policy (``teacher``) and the
per-token reverse-KL advantage its logprobs give the student's own tokens (``reverse_kl``)."""
