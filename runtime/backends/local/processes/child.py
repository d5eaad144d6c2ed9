"""Child processes of the embedded backend: one request at a time over a private socket pair.

Why: the training worker, the sampling worker and the RL loop itself are threads of one interpreter, and the
Python half of each (module calls and bookkeeping between torch ops, the loop's rollouts, scoring and datum
assembly) takes turns on the GIL. While they overlap -- bounded off-policy sampling
(``training.max_steps_off_policy`` > 0) runs the next step's rollouts while this step trains -- each slows the
others: an update beside a sampling thread takes longer than beside a sampling process
(``benchmarks/bench_off_policy.py --settings contention``; the figures: ``benchmarks/local_backend.md``). So for
off-policy runs the embedded backend trains in one child process (``trainer_process``) and samples in another
(``sampler_process``), and the loop's own Python never waits for theirs (``device.use_local_processes``).

``ChildProcess`` starts ``python -c`` running :func:`child_main` with one end of a ``socket.socketpair`` (the
parent's ``sys.path`` passed along, so it imports this very sailrl), sends it an ``init`` message naming its
role, and then :meth:`ChildProcess.call` sends one pickled request and waits for its answer (a blocking socket
read: it releases the GIL). Requests are served one at a time in the order sent. An exception in the child is
pickled back and raised in the parent (by its name and message when it cannot be pickled); a child that dies
raises ``ChildProcessError_`` subclasses naming how (exit code, signal, the OOM killer's signal 9). The child exits
when its end of the socket closes -- ``close()``, the parent's exit, or the parent being killed (the kernel closes
the socket) -- and ignores SIGINT, so Ctrl-C reaches only the parent, which saves state and then closes it.
"""

from __future__ import annotations

import importlib
import json
import pickle
import signal
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

import torch

from sailrl.spec.errors import ServiceError

STARTUP_TIMEOUT_S = 300.0  # a child imports torch + transformers and loads a base model before its first answer


class LocalProcessError(ServiceError, RuntimeError):
    """A child process of the embedded backend stopped or could not start; the message says why in one line."""

    code = "E151"
    fatal = True  # a failed rollout with this error stops the run (not one dropped group)


class ChildProcess:
    """A child process of the embedded backend serving ``role`` (``"sampler"`` or ``"trainer"``). Thread-safe.

    ``init``: the role's settings (JSON-able), handed to its host in the child. ``what``: how messages name it
    ("sampling process"). ``error``: the ``LocalProcessError`` subclass raised when it is gone. The child starts
    at once, so its imports overlap the parent's own start-up; the first call waits for it.
    """

    #: ``"module:Class"`` of the host that serves this role in the child (a subclass sets it; this module imports
    #: no host, so the hosts' modules can import it).
    HOST = ""

    def __init__(self, role: str, init: dict[str, Any], *, what: str, error: type[LocalProcessError]):
        init = {**init, "host": self.HOST}
        self.what = what
        self._error = error
        parent_end, child_end = socket.socketpair()
        # SIGINT ignored before the imports (seconds of them): Ctrl-C is the parent's to handle
        code = ("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                "import json, sys; sys.path[:0] = [p for p in json.loads(sys.argv[3]) if p not in sys.path]; "
                "from sailrl.runtime.backends.local.processes.child import child_main; child_main(int(sys.argv[1]))")
        try:  # argv[2] names the role, for ps
            self._proc = subprocess.Popen(
                [sys.executable, "-c", code, str(child_end.fileno()), f"sailrl-{role}",
                 json.dumps([p for p in sys.path if p])],
                pass_fds=(child_end.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        except OSError as exc:
            parent_end.close()
            raise error(f"could not start the embedded backend's {what}: {exc}") from exc
        finally:
            child_end.close()
        self._conn = Connection(parent_end.detach())
        self._lock = threading.Lock()
        self._closed = False
        self._started = False
        self._conn.send_bytes(_dumps(("init", {"role": role, **init})))

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _stopped(self, during: str) -> LocalProcessError:
        try:  # the socket closes a moment before the exit status can be read
            code = self._proc.wait(2.0)
        except subprocess.TimeoutExpired:
            code = None
        how = f"exit code {code}" if code is not None and code >= 0 else \
            f"killed by signal {-code}" if code is not None else "it stopped answering"
        hint = " (signal 9 is often the kernel's out-of-memory killer)" if code == -9 else ""
        return self._error(f"the embedded backend's {self.what} stopped during {during} ({how}){hint}; --resume "
                           "continues from the last saved state, and SAILRL_LOCAL_PROCESSES=0 trains and samples in "
                           "the run's own process")

    def call(self, op: str, payload: Any, during: str) -> Any:
        """Send one request and return the child's answer; re-raise the child's exception, or raise this process's
        ``LocalProcessError`` when the child is gone. ``during`` names the request in that message."""
        with self._lock:
            if self._closed:
                raise self._error(f"the embedded backend's {self.what} is closed")
            try:
                self._conn.send_bytes(_dumps((op, payload)))
                if not self._started and not self._conn.poll(STARTUP_TIMEOUT_S):
                    raise TimeoutError
                kind, value = pickle.loads(self._conn.recv_bytes())
            except (EOFError, OSError, TimeoutError):
                self._closed = True
                raise self._stopped(during) from None
            self._started = True
        if kind == "error":
            raise _error_from(value)
        return value

    def close(self, timeout: float = 10.0) -> None:
        """Ask the child to exit once its current request is answered, and wait for it; a child still busy or
        silent after ``timeout`` s is killed (a call waiting for it then fails). Idempotent."""
        if self._lock.acquire(timeout=timeout):
            try:
                if not self._closed:
                    self._closed = True
                    try:
                        self._conn.send_bytes(_dumps(("close", None)))
                    except OSError:
                        pass
                self._conn.close()
            finally:
                self._lock.release()
            try:
                self._proc.wait(timeout)
                return
            except subprocess.TimeoutExpired:
                pass
        self._closed = True
        self._proc.kill()
        self._proc.wait()


def _dumps(obj: Any) -> bytes:
    # plain pickle: Connection.send would use multiprocessing's pickler, to which torch adds shared-memory
    # reductions for tensors that only work between processes multiprocessing started
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _error_from(value: tuple[bytes | None, str, str]) -> BaseException:
    blob, name, message = value
    if blob is not None:
        try:
            exc = pickle.loads(blob)
            if isinstance(exc, BaseException):
                return exc
        except Exception:  # noqa: BLE001 -- an exception class the parent cannot rebuild: described below
            pass
    return RuntimeError(f"{name}: {message}")


def _error_value(exc: BaseException) -> tuple[bytes | None, str, str]:
    try:
        blob: bytes | None = pickle.dumps(exc)
        pickle.loads(blob)
    except Exception:  # noqa: BLE001 -- not picklable: sent as its name and message
        blob = None
    return blob, type(exc).__name__, str(exc)


def child_main(fd: int) -> None:
    """The child's loop: build the role's host from ``init``, then answer requests on the connection ``fd``
    until it closes or says ``close``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(fd)
    try:
        _, init = pickle.loads(conn.recv_bytes())
    except (EOFError, OSError):
        return
    import warnings

    warnings.filterwarnings("ignore")
    torch.set_num_threads(max(1, int(init["threads"])))
    module, _, name = init["host"].partition(":")  # the role's host, named by the parent's ChildProcess subclass
    host: Any = getattr(importlib.import_module(module), name)(init)
    while True:
        try:
            request = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            op, payload = pickle.loads(request)
            if op == "close":
                return
            reply: tuple[str, Any] = ("ok", host.handle(op, payload))
        except BaseException as exc:  # noqa: BLE001 -- delivered to the parent, which raises it
            reply = ("error", _error_value(exc))
        try:
            conn.send_bytes(_dumps(reply))
        except (EOFError, OSError):
            return
        except Exception as exc:  # noqa: BLE001 -- an answer that cannot be pickled: say so instead
            conn.send_bytes(_dumps(("error", _error_value(exc))))
