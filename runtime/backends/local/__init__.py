"""The embedded backend: an in-process implementation of the Tinker client interface.

``LocalServiceClient`` (torch + transformers + peft) creates training and sampling clients that
``tinker_cookbook``'s RL functions use unchanged. See ``service.py`` for the entry point,
``sources.py`` for the models it loads (built-in, folder, GGUF file, hub id) and
``docs/architecture.md`` for where it sits. ``check_model_source`` checks a model before a run
writes anything.
"""

from sailrl.runtime.backends.local.weights.checkpoints import CheckpointPathError
from sailrl.runtime.backends.local.sampling import LocalSamplingClient
from sailrl.runtime.backends.local.service import LocalServiceClient
from sailrl.runtime.backends.local.weights.sources import BaseModelError, check_model_source
from sailrl.runtime.backends.local.training import LocalTrainingClient

__all__ = [
    "BaseModelError",
    "CheckpointPathError",
    "LocalSamplingClient",
    "LocalServiceClient",
    "LocalTrainingClient",
    "check_model_source",
]
