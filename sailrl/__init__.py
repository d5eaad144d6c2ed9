"""sailrl: compile a YAML RL fine-tuning spec into a standalone training script.

The pipeline, one folder a stage (mapped into this package by ``pyproject.toml``):

- ``sailrl.spec``      (``spec/``)      the spec language: schema, YAML loading with locations, errors.
- ``sailrl.compiler``  (``compiler/``)  semantic validation and rendering of the training script.
- ``sailrl.runtime``   (``runtime/``)   what generated scripts import: data, prompts, reward rules,
                                         the RL loop, the Tinker + Sail adapters and the embedded
                                         local backend (``sailrl.runtime.local``).
- ``sailrl.commands``                   one module per ``sailrl`` subcommand.
"""

__version__ = "0.2.0"
