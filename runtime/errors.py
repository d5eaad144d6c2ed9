"""The errors a run raises, and :func:`phase`, which times a step's phase and names the step and phase of a fault.

Every class derives from :class:`~sailrl.spec.errors.SailrlError` through its category (``ServiceError``: a
service or backend fault; ``UserError``: something the user fixes). ``sailrl.launch`` turns them into exit
statuses: :class:`BudgetReached` 3, the others 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

from sailrl.spec.errors import SailrlError, ServiceError, UserError

__all__ = ["AllDegenerateError", "BudgetReached", "OnPolicyMismatch", "RunDirectoryError", "RunError", "phase"]


class RunError(ServiceError):
    """A service or backend fault, with the step and phase it happened in."""

    code = "E100"


class AllDegenerateError(RunError):
    """Every group of a step scored the same and the spec says ``on_all_degenerate: stop``."""

    code = "E101"


class OnPolicyMismatch(ServiceError):
    """The sampler's logprobs disagree with the learner's (``sampling.on_policy_mismatch: stop``)."""

    code = "E102"


class RunDirectoryError(UserError, FileExistsError):
    """The run directory holds a run that this command would overwrite, or that is already complete."""

    code = "E103"


class BudgetReached(SailrlError):
    """The next step would take the run's estimated cost above ``training.max_cost_usd``. Not a failure: state is
    saved and the run can be resumed with a larger budget."""

    code = "E104"


@contextlib.contextmanager
def phase(step: int, name: str, timings: dict[str, float]) -> Iterator[None]:
    """Time a phase into ``timings['time/<name>']`` (seconds); re-raise a fault naming the step and phase."""
    t0 = time.perf_counter()
    try:
        yield
    except (KeyboardInterrupt, asyncio.CancelledError, SailrlError):
        raise
    except Exception as exc:  # a Tinker / Sail / backend fault: say where it happened
        raise RunError(f"step {step}, phase '{name}': {type(exc).__name__}: {exc}") from exc
    finally:
        timings[f"time/{name}"] = round(timings.get(f"time/{name}", 0.0) + time.perf_counter() - t0, 4)
