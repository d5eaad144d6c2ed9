"""Device, dtype and CPU thread count of the embedded backend.

- Device (:func:`local_device`): ``$SAILRL_DEVICE`` when set (``cpu``, ``cuda``, ``cuda:1``, ...); else the CPU for
  the built-in models (at 0.46 M parameters a GPU only adds transfer overhead); else CUDA when
  ``torch.cuda.is_available()``; else the CPU.
- Dtype (:func:`local_dtype`): ``$SAILRL_DTYPE`` when set (``float32``, ``bfloat16``, ``float16``); else
  bfloat16 on a CUDA device that supports it (``torch.cuda.is_bf16_supported()``); else float32. LoRA weights
  stay float32 (peft upcasts adapters) and losses are computed on float32 logits.
- Threads (:func:`thread_count`): ``$SAILRL_THREADS`` when set; else 1 for the built-in models; else torch's
  default (one per core). Each of the backend's two worker threads (training, sampling) uses that count, so
  with 1 the two overlap on two cores. The built-in models' 128-wide matrices gain nothing from a second thread;
  a larger model's matrices are large enough to split on a machine with idle cores (``benchmarks/bench_threads.py``;
  the figures: ``benchmarks/local_backend.md``).
- Child processes (:func:`use_local_processes`): ``$SAILRL_LOCAL_PROCESSES`` when set (``1`` on, ``0`` off); else
  on for a bounded off-policy run (``training.max_steps_off_policy`` > 0) on the CPU, off otherwise. Off-policy
  sampling overlaps training, and threads of one interpreter slow each other on the GIL (see ``child``), so the
  backend then trains in one child process and samples in another; a synchronous run never overlaps them and skips
  the children's start-up. On a GPU the kernels run outside the GIL, and each child would need its own CUDA
  context and model copies. Off-policy runs gain more from overlap with the children than in one process, on an
  idle and on a busy machine (``benchmarks/bench_off_policy.py --settings local``; the figures:
  ``benchmarks/local_backend.md``).
"""

from __future__ import annotations

import os

import torch

from sailrl.spec.errors import ConfigError
from sailrl.spec.models import is_builtin

__all__ = ["local_device", "local_dtype", "thread_count", "use_local_processes"]

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def local_device(model_name: str) -> str:
    """The torch device for ``model_name`` (see the module docstring). Raises ``ConfigError`` when
    ``SAILRL_DEVICE`` names CUDA and no CUDA device is present."""
    chosen = os.environ.get("SAILRL_DEVICE", "").strip()
    if chosen:
        if chosen.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"SAILRL_DEVICE={chosen} but torch sees no CUDA device (torch {torch.__version__}); "
                              "unset it to run on the CPU, or install a CUDA build of torch")
        return chosen
    if is_builtin(model_name):
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def local_dtype(device: str) -> torch.dtype:
    """The parameter dtype on ``device`` (see the module docstring). Raises ``ConfigError`` for an unknown
    ``SAILRL_DTYPE``."""
    chosen = os.environ.get("SAILRL_DTYPE", "").strip().lower()
    if chosen:
        if chosen not in _DTYPES:
            raise ConfigError(f"SAILRL_DTYPE={chosen} is not a dtype sailrl knows: use float32, bfloat16 or float16")
        return _DTYPES[chosen]
    if device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def thread_count(model_name: str) -> int | None:
    """``torch.set_num_threads`` value for ``model_name``, or None for torch's default. Raises ``ConfigError``
    when ``SAILRL_THREADS`` is not a positive integer."""
    chosen = os.environ.get("SAILRL_THREADS", "").strip()
    if chosen:
        if not chosen.isdigit() or int(chosen) < 1:
            raise ConfigError(f"SAILRL_THREADS={chosen} must be a positive whole number of threads")
        return int(chosen)
    return 1 if is_builtin(model_name) else None


def use_local_processes(device: str, max_steps_off_policy: int) -> bool:
    """Whether the embedded backend trains and samples in child processes (see the module docstring). Raises
    ``ConfigError`` when ``SAILRL_LOCAL_PROCESSES`` is not 0 or 1."""
    chosen = os.environ.get("SAILRL_LOCAL_PROCESSES", "").strip()
    if chosen:
        if chosen not in ("0", "1"):
            raise ConfigError(f"SAILRL_LOCAL_PROCESSES={chosen} must be 1 (train and sample in child processes) or "
                              "0 (in the run's own process); unset it for the default")
        return chosen == "1" and os.name == "posix"
    return max_steps_off_policy > 0 and device == "cpu" and os.name == "posix"
