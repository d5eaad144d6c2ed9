"""The embedded backend: an in-process implementation of the Tinker client interface.

``LocalServiceClient`` (torch + transformers + peft) creates training and sampling clients that
``tinker_cookbook``'s RL functions use unchanged. See ``service.py`` for the entry point and
``docs/architecture.md`` for where it sits.
"""

from sailrl.runtime.local.checkpoints import CheckpointPathError
from sailrl.runtime.local.sampling import LocalSamplingClient
from sailrl.runtime.local.service import LocalServiceClient
from sailrl.runtime.local.tiny import BaseModelError
from sailrl.runtime.local.training import LocalTrainingClient

__all__ = [
    "BaseModelError",
    "CheckpointPathError",
    "LocalSamplingClient",
    "LocalServiceClient",
    "LocalTrainingClient",
]
