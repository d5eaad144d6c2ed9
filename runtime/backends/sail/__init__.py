"""Sampling rollouts on Sail from Tinker sampler checkpoints.

- `adapter_config_for(...)` (`adapter_config`): the PEFT ``adapter_config`` that describes the LoRA Tinker trains,
  derived from the spec's LoRA settings.
- `AdaptiveSailCompleter` / `make_sail_policy(...)` (`completer`): a tinker-cookbook ``TokenCompleter`` that sends
  exactly the request `sail.SailTokenCompleter` sends, polls on a schedule shared by the step's rollouts, checks
  each completion, retries failed ones a bounded number of times and then raises `SailRolloutError`.
- `signed_checkpoint_url(...)` (`checkpoint_url`): the signed archive URL of a Tinker sampler checkpoint, via
  `sail.get_tinker_checkpoint_signed_url_async`; `CheckpointURLRefused` when Tinker refuses to sign it.

The sail SDK reads ``SAIL_API_URL`` and ``SAIL_API_KEY`` (or ``~/.sail``) once per process;
``sail.reset_transports()`` re-reads them.
"""

from sailrl.runtime.backends.sail.adapter_config import TINKER_DEFAULT_LORA_ALPHA, adapter_config_for, lora_family
from sailrl.runtime.backends.sail.checkpoint_url import (
    ARCHIVE_URL_METHOD,
    CheckpointURLRefused,
    SailCheckpointError,
    signed_checkpoint_url,
    signed_url_problem,
    tinker_rest_client_class,
)
from sailrl.runtime.backends.sail.completer import (
    DEFAULT_POLL_DEADLINE_S,
    AdaptiveSailCompleter,
    PollPolicy,
    SailRequestRejected,
    SailRolloutError,
    SailStats,
    completion_window_problem,
    make_sail_policy,
)

__all__ = [
    "ARCHIVE_URL_METHOD",
    "DEFAULT_POLL_DEADLINE_S",
    "TINKER_DEFAULT_LORA_ALPHA",
    "AdaptiveSailCompleter",
    "CheckpointURLRefused",
    "PollPolicy",
    "SailCheckpointError",
    "SailRequestRejected",
    "SailRolloutError",
    "SailStats",
    "adapter_config_for",
    "completion_window_problem",
    "lora_family",
    "make_sail_policy",
    "signed_checkpoint_url",
    "signed_url_problem",
    "tinker_rest_client_class",
]
