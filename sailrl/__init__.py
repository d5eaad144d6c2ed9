"""sailrl: compile a YAML RL fine-tuning spec into a standalone training script.

The pipeline, one folder a stage (mapped into this package by ``pyproject.toml``):

- ``sailrl.spec``      (``spec/``)      the spec language: schema, YAML loading with locations, errors.
- ``sailrl.compiler``  (``compiler/``)  semantic validation and rendering of the training script.
- ``sailrl.runtime``   (``runtime/``)   what generated scripts import: data, prompts, reward rules,
                                         the run's parts (sampler, records, checkpoints, budget), the
                                         Tinker + Sail adapters and the embedded local backend
                                         (``sailrl.runtime.backends.local``). The RL loop itself is in each
                                         generated script's ``main()``.
- ``sailrl.commands``                   one module per ``sailrl`` subcommand; ``sailrl.launch`` is a
                                         generated script's entry point.
"""

from sailrl.spec.version import __version__

__all__ = ["__version__"]
