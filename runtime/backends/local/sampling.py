"""``LocalSamplingClient``: the ``tinker.SamplingClient`` interface over an in-process model.

Concurrent ``sample`` calls are coalesced: each call queues its request and, if none is pending,
one batch job on the backend's sampling worker thread (``backend.LocalBackend.sample_worker``,
separate from the training worker, so sampling runs while a step trains). A caller that knows how many
calls are coming (the loop: every rollout of a step) announces them with ``expect_requests(n)``: the job then
waits for those ``n`` calls, however slowly a busy machine delivers them, and serves exactly them as one batch
(at most ``expect_timeout_s`` = 2 s, then what has arrived), so a step's batch, and hence its numbers, do not
depend on the load. Otherwise the job waits until no new request has arrived for ``coalesce_window_s`` (default
3 ms, at most ``max_wait_s`` = 50 ms). Either way the batch is ONE ``generation.generate`` call (each distinct
prompt prefilled once).
``tinker_cookbook.rl.rollout_strategy.FailFast`` runs a group's rollouts with ``asyncio.gather``,
one ``sample_async(num_samples=1)`` per env, so a whole group (or a whole step, when groups are
gathered too) becomes one batched generation. The batch is decoded by the batcher's engine: in this process
(``InProcessEngine``) or in the backend's sampling process (``ProcessEngine``, see ``sampler_process``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import tinker
import torch
from tinker import types
from tinker.lib.public_interfaces.api_future import APIFuture, AwaitableConcurrentFuture

from sailrl.runtime.backends.local.futures import Worker
from sailrl.runtime.backends.local.engine.generation import SampleRequest, generate
from sailrl.runtime.backends.local.processes.sampler_process import SamplerProcess, Source
from sailrl.runtime.backends.local.sdk import refuse_the_rest

_REQUEST_IDS = itertools.count()


class InProcessEngine:
    """Decodes a batch in this process: ``generation.generate`` over ``model`` (a sampler's own copy)."""

    def __init__(self, model: Any, tokenizer: Any, max_context: int, generator: torch.Generator):
        self.model = model
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.generator = generator

    def __call__(self, requests: list[SampleRequest]) -> list[types.SampleResponse]:
        return generate(self.model, requests, tokenizer=self.tokenizer, max_context=self.max_context,
                        generator=self.generator)


class ProcessEngine:
    """Decodes a batch in the sampling process (``sampler_process.SamplerProcess``) over ``source``'s model."""

    def __init__(self, process: SamplerProcess, source: Source):
        self.process = process
        self.source = source

    def __call__(self, requests: list[SampleRequest]) -> list[types.SampleResponse]:
        return self.process.generate(self.source, requests)


class SampleBatcher:
    """Collects sample requests for one model and serves them in batches on ``worker``; ``engine`` decodes a
    batch (``InProcessEngine`` or ``ProcessEngine``): a list of ``SampleRequest`` -> one ``SampleResponse`` each.

    Batches are announced ones (:meth:`expect`: the next ``n`` requests, one batch) or, with none announced,
    what arrives within the coalescing window (see the module docstring)."""

    def __init__(
        self,
        worker: Worker,
        engine: Callable[[list[SampleRequest]], list[types.SampleResponse]],
        coalesce_window_s: float = 0.003,
        max_wait_s: float = 0.05,
        expect_timeout_s: float = 2.0,
    ):
        self._worker = worker
        self.engine = engine
        self._window = coalesce_window_s
        self._max_wait = max_wait_s
        self._expect_timeout = expect_timeout_s
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._pending: list[tuple[SampleRequest, Future]] = []
        self._expected: deque[int] = deque()  # sizes (in requests) of the announced batches, in order
        self._scheduled = False
        self.batch_sizes: list[int] = []  # rows served per batch, for tests and benchmarks

    def expect(self, requests: int) -> None:
        """The next ``requests`` submitted requests form one batch (after any batches announced before)."""
        if requests > 0:
            with self._lock:
                self._expected.append(int(requests))

    def submit(self, request: SampleRequest) -> AwaitableConcurrentFuture[types.SampleResponse]:
        fut: Future = Future()
        with self._lock:
            self._pending.append((request, fut))
            self._arrived.notify_all()
            schedule = not self._scheduled
            self._scheduled = True
        if schedule:
            self._worker.submit(self._serve)
        return AwaitableConcurrentFuture(fut)

    def _take_announced(self) -> list[tuple[SampleRequest, Future]] | None:
        """With the lock held: wait for the first announced batch and take it; ``None`` when none is announced."""
        if not self._expected:
            return None
        size = self._expected[0]
        deadline = time.monotonic() + self._expect_timeout
        while len(self._pending) < size:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._arrived.wait(left)
        self._expected.popleft()
        batch, self._pending = self._pending[:size], self._pending[size:]
        return batch

    def _take_coalesced(self) -> list[tuple[SampleRequest, Future]]:
        deadline = time.monotonic() + self._max_wait
        seen = -1
        while True:
            with self._lock:
                count = len(self._pending)
            if count == seen or time.monotonic() >= deadline:
                break
            seen = count
            time.sleep(self._window)
        with self._lock:
            batch, self._pending = self._pending, []
        return batch

    def _serve(self) -> None:
        with self._lock:
            batch = self._take_announced()
        if batch is None:
            batch = self._take_coalesced()
        with self._lock:
            more = bool(self._pending)
            self._scheduled = more
        if more:  # requests past an announced batch: their own job, queued behind this one
            self._worker.submit(self._serve)
        if not batch:
            return
        requests = [req for req, _ in batch]
        try:
            responses = self.engine(requests)
        except BaseException as exc:  # noqa: BLE001 -- delivered through each future
            for _, fut in batch:
                fut.set_exception(exc)
            return
        self.batch_sizes.append(sum(r.num_samples for r in requests))
        for (_, fut), response in zip(batch, responses, strict=True):
            fut.set_result(response)


def _unsupported(name: str, value: Any) -> ValueError:
    return ValueError(f"The embedded backend does not support {name}={value!r} in sample(); leave it unset.")


@refuse_the_rest(tinker.SamplingClient)
class LocalSamplingClient(tinker.SamplingClient):
    """In-process ``tinker.SamplingClient`` (an instance of it): ``sample``, ``compute_logprobs``,
    ``get_tokenizer``. It cannot be pickled (its model lives in this process or the backend's sampling process).

    Build it through ``LocalServiceClient.create_sampling_client`` or a training client's
    ``save_weights_and_get_sampling_client`` / ``create_sampling_client``.
    """

    def __init__(self, batcher: SampleBatcher, tokenizer: Any, base_model: str, model_path: str | None):
        self._batcher = batcher
        self._tokenizer = tokenizer
        self._base_model = base_model
        self.model_path = model_path

    def sample(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        topk_sample_logprobs: int = 0,
        target_prompt_logprobs: types.TensorData | None = None,
        prompt_alt_tokens_k: int = 0,
        prompt_logprobs_last_n: int | None = None,
    ) -> APIFuture[types.SampleResponse]:
        """Sample ``num_samples`` continuations of ``prompt``; an ``APIFuture`` of ``SampleResponse``.

        Each ``SampledSequence`` has ``tokens``, ``logprobs`` (temperature-scaled, see
        ``generation``) and ``stop_reason`` ``"stop"`` | ``"length"``. ``include_prompt_logprobs``
        fills ``prompt_logprobs`` (``None`` at position 0), ``topk_prompt_logprobs=k`` fills
        ``topk_prompt_logprobs``. Raises ``ValueError`` for ``num_samples < 1`` and for the
        unsupported options ``topk_sample_logprobs``, ``target_prompt_logprobs``,
        ``prompt_alt_tokens_k``; an empty or over-long prompt fails the future with ``ValueError``.
        """
        if num_samples < 1:
            raise ValueError(f"num_samples must be at least 1, got {num_samples}.")
        if topk_sample_logprobs:
            raise _unsupported("topk_sample_logprobs", topk_sample_logprobs)
        if target_prompt_logprobs is not None:
            raise _unsupported("target_prompt_logprobs", "...")
        if prompt_alt_tokens_k:
            raise _unsupported("prompt_alt_tokens_k", prompt_alt_tokens_k)
        tokens = prompt.to_ints()
        if prompt_logprobs_last_n is not None:
            if not include_prompt_logprobs:
                raise ValueError("prompt_logprobs_last_n requires include_prompt_logprobs=True.")
            if not 1 <= prompt_logprobs_last_n <= len(tokens) - 1:
                raise ValueError(
                    f"prompt_logprobs_last_n must be between 1 and len(prompt) - 1 = {len(tokens) - 1}."
                )
        request = SampleRequest(
            prompt=tokens,
            num_samples=num_samples,
            params=sampling_params,
            include_prompt_logprobs=include_prompt_logprobs,
            topk_prompt_logprobs=topk_prompt_logprobs,
            prompt_logprobs_last_n=prompt_logprobs_last_n,
            request_id=f"s{next(_REQUEST_IDS)}",
        )
        return self._batcher.submit(request)

    async def sample_async(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        topk_sample_logprobs: int = 0,
        target_prompt_logprobs: types.TensorData | None = None,
        prompt_alt_tokens_k: int = 0,
        prompt_logprobs_last_n: int | None = None,
    ) -> types.SampleResponse:
        """Async ``sample``: returns the ``SampleResponse`` itself (as the SDK's ``sample_async``)."""
        return await self.sample(
            prompt,
            num_samples,
            sampling_params,
            include_prompt_logprobs,
            topk_prompt_logprobs,
            topk_sample_logprobs,
            target_prompt_logprobs,
            prompt_alt_tokens_k,
            prompt_logprobs_last_n,
        )

    def compute_logprobs(
        self, prompt: types.ModelInput, prompt_logprobs_last_n: int | None = None
    ) -> APIFuture[list[float | None]]:
        """Log-probabilities of each prompt token given the tokens before it (``None`` at 0)."""
        inner = self.sample(
            prompt,
            1,
            types.SamplingParams(max_tokens=1),
            include_prompt_logprobs=True,
            prompt_logprobs_last_n=prompt_logprobs_last_n,
        )
        out: Future = Future()

        def _done(f: Future) -> None:
            if f.exception() is not None:
                out.set_exception(f.exception())
            else:
                out.set_result(f.result().prompt_logprobs)

        inner.future().add_done_callback(_done)
        return AwaitableConcurrentFuture(out)

    async def compute_logprobs_async(
        self, prompt: types.ModelInput, prompt_logprobs_last_n: int | None = None
    ) -> list[float | None]:
        """Async ``compute_logprobs``: returns the list itself (as the SDK)."""
        return await self.compute_logprobs(prompt, prompt_logprobs_last_n)

    def expect_requests(self, count: int) -> None:
        """Not in the SDK: the next ``count`` ``sample`` calls (say every rollout of a step) are served as one
        batch, whenever they arrive (within 2 s) -- a batch that does not depend on the machine's load."""
        self._batcher.expect(count)

    def get_tokenizer(self) -> Any:
        """The tokenizer of the base model (``runtime.backends.models.get_tokenizer``)."""
        return self._tokenizer

    def get_base_model(self) -> str:
        """The base model name, e.g. ``"sailrl/tiny"``."""
        return self._base_model

    def get_telemetry(self) -> None:
        """No telemetry: nothing leaves this machine."""
        return None

    def on_queue_state_change(self, queue_state: Any, queue_state_reason: str | None) -> None:
        """No service queue here: nothing to report."""

    def __reduce__(self) -> Any:
        raise TypeError("A sampling client of the embedded backend cannot be pickled: its model lives in this "
                        "process (or the backend's sampling process); run rollouts in this process.")

    async def get_base_model_async(self) -> str:
        return self._base_model
