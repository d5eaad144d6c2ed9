"""Futures and the worker threads of the embedded backend.

A ``Worker`` is one thread running its jobs in submission order. The backend has two
(``backend.LocalBackend``): the training worker runs every operation of the training clients
(forward_backward, optim_step, saves, loads) in order, like Tinker's per-model request
sequencing -- a ``forward_backward`` followed by an ``optim_step`` submitted before the first
result is read (as ``tinker_cookbook.rl.train.train_step`` does) still runs in that order -- and
the sampling worker runs sample batches and loads sampler checkpoints, so sampling can proceed
while a step trains. Results come back as
``tinker.lib.public_interfaces.api_future.AwaitableConcurrentFuture`` -- the SDK's own
``APIFuture`` class -- so ``.result()``, ``await future`` and ``await future.result_async()`` all
work as with the real client.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, TypeVar

import torch
from tinker.lib.public_interfaces.api_future import AwaitableConcurrentFuture

T = TypeVar("T")


class ThreadBudget:
    """Torch intra-op threads shared by the workers of one backend.

    A job gets ``total`` threads while it is the only one running and ``max(1, total // busy)``
    while ``busy`` workers run jobs at once (``torch.set_num_threads`` is per thread, set at the
    start of each job), so two workers overlapping on ``total`` cores do not oversubscribe them.
    """

    def __init__(self, total: int):
        self.total = max(1, int(total))
        self._busy = 0
        self._lock = threading.Lock()

    @contextmanager
    def job(self) -> Iterator[int]:
        """Count the calling worker busy for the block and set its torch threads; yields the count."""
        with self._lock:
            self._busy += 1
            threads = max(1, self.total // self._busy)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        try:
            yield threads
        finally:
            with self._lock:
                self._busy -= 1


class Worker:
    """One daemon thread running submitted callables in FIFO order.

    ``budget``: the ``ThreadBudget`` each job takes its torch intra-op threads from; ``None`` keeps
    what the thread inherits.
    """

    def __init__(self, name: str = "sailrl-local-worker", budget: ThreadBudget | None = None):
        self._queue: queue.Queue[tuple[Callable[[], Any], Future] | None] = queue.Queue()
        self._name = name
        self._budget = budget
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _ensure_started(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                if self._budget is None:
                    result = fn()
                else:
                    with self._budget.job():
                        result = fn()
            except BaseException as exc:  # noqa: BLE001 -- delivered to whoever reads the future
                fut.set_exception(exc)
            else:
                fut.set_result(result)

    def in_worker(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(self, fn: Callable[[], T]) -> AwaitableConcurrentFuture[T]:
        """Queue ``fn`` and return an ``APIFuture`` of its result (or exception).

        Called from the worker thread itself (a nested call), ``fn`` runs at once instead of
        queueing, so it cannot deadlock waiting behind its caller.
        """
        fut: Future = Future()
        if self.in_worker():
            fut.set_running_or_notify_cancel()
            try:
                fut.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 -- delivered through the future
                fut.set_exception(exc)
            return AwaitableConcurrentFuture(fut)
        self._ensure_started()
        self._queue.put((fn, fut))
        return AwaitableConcurrentFuture(fut)

    def close(self, timeout: float | None = 60.0) -> None:
        """Stop the thread after the jobs already queued; wait up to ``timeout`` s for it to finish them
        (not when called from the worker itself). A later ``submit`` starts a new thread."""
        with self._lock:
            thread = self._thread
            if thread is None or not thread.is_alive():
                return
            self._queue.put(None)
        if thread is not threading.current_thread():
            thread.join(timeout)


def completed(value: T) -> AwaitableConcurrentFuture[T]:
    """An ``APIFuture`` that is already done with ``value``."""
    fut: Future = Future()
    fut.set_result(value)
    return AwaitableConcurrentFuture(fut)
