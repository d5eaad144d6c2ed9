"""The errors a run raises, and :func:`phase`, which times a step's phase and names the step and phase of a fault.

Every class derives from :class:`~sailrl.spec.errors.SailrlError` through its category (``ServiceError``: a
service or backend fault; ``UserError``: something the user fixes; :class:`RunStopped`: a stop the spec asked for).
``sailrl.launch`` turns them into exit statuses: :class:`BudgetReached` 3, :class:`RunStopped` 4, the others 1.

:func:`service_fault` tells a fault of a service, of its HTTP transport or of the embedded backend (the Tinker and
Sail SDKs' errors, httpx / aiohttp / requests errors, a refused or dropped connection, a time-out, an out-of-memory
error) from everything else, which is a bug in sailrl: :func:`phase` wraps only the former, so the latter keeps its
own type and traceback and the command line exits 70 with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

from sailrl.runtime.backends.faults import service_fault
from sailrl.runtime.rundir.writes import write_error
from sailrl.spec.errors import SailrlError, ServiceError

__all__ = ["AllDegenerateError", "BudgetReached", "OnPolicyMismatch", "RunError", "RunStopped", "phase"]


class RunError(ServiceError):
    """A service or backend fault, with the step and phase it happened in."""

    code = "E100"


class RunStopped(SailrlError):
    """The run stopped where its spec says to stop on what a step found (``training.on_all_degenerate: stop``,
    ``sampling.on_policy_mismatch: stop``): neither a service fault nor a bug. State is saved; exit status 4."""

    code = "E107"


class AllDegenerateError(RunStopped):
    """Every group of a step scored the same and the spec says ``on_all_degenerate: stop``."""

    code = "E101"


class OnPolicyMismatch(RunStopped):
    """The sampler's logprobs disagree with the learner's (``sampling.on_policy_mismatch: stop``)."""

    code = "E102"


class BudgetReached(SailrlError):
    """The next step would take the run's estimated cost above ``training.max_cost_usd``. Not a failure: state is
    saved and the run can be resumed with a larger budget."""

    code = "E104"


@contextlib.contextmanager
def phase(step: int, name: str, timings: dict[str, float]) -> Iterator[None]:
    """Time a phase into ``timings['time/<name>']`` (seconds). A service fault (:func:`service_fault`) is
    re-raised as a :class:`RunError` naming the step and phase, a disk failure as a :class:`RunWriteError`;
    anything else (sailrl's own errors, a bug) passes unchanged."""
    t0 = time.perf_counter()
    try:
        yield
    except (KeyboardInterrupt, asyncio.CancelledError, SailrlError):
        raise
    except Exception as exc:
        if (disk := write_error(exc)) is not None:  # a backend's checkpoint write: the disk, not the service
            raise disk from exc
        if not service_fault(exc):
            raise  # a bug in sailrl: its own type and traceback (exit 70), never dressed as a service fault
        raise RunError(f"step {step}, phase '{name}': {type(exc).__name__}: {exc}") from exc
    finally:
        timings[f"time/{name}"] = round(timings.get(f"time/{name}", 0.0) + time.perf_counter() - t0, 4)
