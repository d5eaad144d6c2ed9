"""`AdaptiveSailCompleter`: rollouts on Sail with the SDK's request, a poll schedule shared across a step, bounded
retries and checked completions.

One completer serves one RL step: its concurrent calls share a `_StepPollState`, which also says when each of
them polls next. Until a response of the step is final, a few *scout* rollouts poll densely (together every
``max(min_interval_s, dense_fraction * elapsed)`` seconds) and the others sparsely; the first final response gives
an estimate of the service time, and every rollout then polls at its own creation + that estimate, then about once
a second (like a plain 1 s poller), and densely again once it is among the step's last few unfinished rollouts: a
step waits for its slowest rollout, so the tail is where polls pay (`PollPolicy` has the exact schedule).

Completions are checked before they reach the loop: an answer that does not parse, non-finite logprobs, a logprob
count that differs from the token count, token ids outside the vocabulary, more tokens than ``max_output_tokens``,
or an empty completion are a counted failure (``sail/malformed``), retried with a new request a bounded number of
times, then `SailRolloutError`.

The sail SDK reads every response body whole into memory (its Rust core has no size cap) and parses it; this module
checks the sizes of the token and logprob arrays against ``max_output_tokens`` before it iterates over them.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import sail
import sail.inference as sail_inference
import sail.tinker as sail_tinker
from sail.errors import InferenceError, InferenceHTTPError, InvalidArgumentError
from tinker_cookbook.completers import TokensWithLogprobs

from sailrl.spec.errors import SailrlError, ServiceError

__all__ = [
    "DEFAULT_POLL_DEADLINE_S",
    "AdaptiveSailCompleter",
    "PollPolicy",
    "SailRequestRejected",
    "SailRolloutError",
    "SailStats",
    "completion_window_problem",
    "make_sail_policy",
]

#: Seconds a Sail response may stay unfinished before the attempt counts as failed: the sail SDK's own
#: ``poll_timeout`` default (``sail.tinker._DEFAULT_POLL_TIMEOUT_SECONDS``, 20 minutes).
DEFAULT_POLL_DEADLINE_S = 20 * 60.0

#: The sail SDK's wording when a 2xx answer's body is not JSON (it reports it as a synthetic HTTP 503).
_SDK_MALFORMED_BODY = "malformed JSON in "
_REASON_LIMIT = 300  # characters of one failure reason kept in messages
RAW_BODY_BYTES = 8 * 2**20  # bytes of an unparseable poll answer read again to name what is wrong in it
RAW_FETCH_S = 10.0  # seconds that second read may take


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class SailRolloutError(ServiceError):
    """One rollout could not be sampled on Sail within the bounded retries; drop its group and count it.

    Attributes: ``reason`` (the last failure, e.g. "status failed", "HTTP 500 on create", "timeout: ...",
    "malformed output: ..."), ``reasons`` (one per attempt), ``attempts``, ``response_ids`` (the Sail responses
    created, for support requests).
    """

    code = "E142"

    def __init__(self, message: str, *, reasons: list[str], attempts: int, response_ids: list[str]) -> None:
        super().__init__(message)
        self.reasons = list(reasons)
        self.reason = reasons[-1] if reasons else "unknown"
        self.attempts = attempts
        self.response_ids = list(response_ids)


class SailRequestRejected(ServiceError):
    """Sail refused the request itself (HTTP 4xx such as a bad key or an unknown model, or no API key set).

    Retrying cannot help and every rollout would fail the same way, so this is deliberately NOT a
    `SailRolloutError`: the run should stop with this message. ``status_code`` is the HTTP status (None when the
    SDK refused before sending).
    """

    code = "E143"
    fatal = True  # a failed rollout with this error stops the run (not one dropped group)

    def __init__(self, message: str, *, status_code: int | None) -> None:
        super().__init__(message)
        self.status_code = status_code


@dataclass(frozen=True)
class PollPolicy:
    """How `AdaptiveSailCompleter` waits for background responses and retries failed ones (times in seconds).

    With ``adaptive`` (the default) the rollouts of one completer share a schedule. ``elapsed`` is the time since
    a rollout's response was created.

    - *Scouts* (the first ``scouts`` rollouts that start before any response is final) share one schedule and
      take turns: scout i (0-based) first polls ``(i + 1) * min_interval_s`` after creation; after that the next
      scout poll, by whichever scout is due first, comes ``dense_interval = max(min_interval_s, dense_fraction *
      elapsed)`` after the last one, so the estimate is late by about one ``dense_interval`` at most.
    - The others, until a response is final: the sparse schedule, first poll after ``first_poll_s``, then every
      ``min(max_interval_s, max(first_poll_s, sparse_fraction * elapsed))``, shortened by up to ``jitter`` (a
      uniform fraction) so rollouts do not poll in lockstep.
    - Once a response is final after ``T`` seconds (the shortest seen so far, the *estimate*), a rollout polls at
      ``elapsed == T`` (at once if it is older and has not polled since); after that, every
      ``max(due_interval_s, dense_fraction * elapsed)`` (shortened by up to ``jitter``) while many of the step's
      rollouts are unfinished, and every ``dense_interval`` once the step is in its *tail*: at most
      ``max(tail_min, tail_fraction * peak)`` rollouts unfinished, ``peak`` being the most that were in flight at
      once. Entering the tail wakes the waiting rollouts, so the last ones are seen within about
      ``dense_fraction`` of their elapsed time.
    - A rollout whose poll at the estimate missed by a little (it is still within ``overdue_fraction`` of the
      estimate past it) polls again every ``dense_interval`` until then: the estimate is the shortest time seen
      from a response's creation *as this client stamped it*, so the jitter of when the concurrent create answers
      arrive can put it a little below another response's service time, and a whole step's rollouts would
      otherwise miss together and wait ``due_interval_s``. That costs at most about ``overdue_fraction /
      dense_fraction`` polls per late rollout (2 with the defaults).

    Without ``adaptive`` every rollout follows the sparse schedule alone (``PollPolicy.fixed(1.0)`` is a plain 1 s
    poller). A response not final ``response_deadline_s`` after its creation (or after ``max_polls`` polls, when
    set) is a timeout. A failed attempt (status failed/cancelled/expired, HTTP 5xx/408/409/425/429, a transport
    error, a timeout, a malformed answer) is retried with a new request after
    ``min(retry_max_s, retry_base_s * 2**(n-1)) * (1 - jitter * u)`` seconds (retry n, u uniform in [0, 1)), up to
    ``max_attempts`` attempts in all. ``request_timeout_s`` bounds each HTTP call.

    Raises ValueError for a value out of range (named in the message).
    """

    adaptive: bool = True
    scouts: int = 2
    min_interval_s: float = 0.025
    dense_fraction: float = 0.05
    due_interval_s: float = 1.0
    tail_fraction: float = 0.1
    tail_min: int = 2
    overdue_fraction: float = 0.1
    first_poll_s: float = 2.0
    sparse_fraction: float = 0.5
    max_interval_s: float = 60.0
    jitter: float = 0.25
    response_deadline_s: float = DEFAULT_POLL_DEADLINE_S
    max_polls: int | None = None
    max_attempts: int = 3
    retry_base_s: float = 1.0
    retry_max_s: float = 30.0
    request_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        positive = ("min_interval_s", "due_interval_s", "first_poll_s", "max_interval_s", "response_deadline_s",
                    "request_timeout_s")
        for name in positive:
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"PollPolicy.{name} must be a finite number > 0, got {value!r}")
        for name in ("dense_fraction", "sparse_fraction", "overdue_fraction"):
            if not 0 <= getattr(self, name) <= 10:
                raise ValueError(f"PollPolicy.{name} must be in [0, 10], got {getattr(self, name)!r}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"PollPolicy.jitter must be in [0, 1), got {self.jitter!r}")
        if self.scouts < 0 or self.tail_min < 0:
            raise ValueError(f"PollPolicy.scouts and tail_min must be >= 0, got {self.scouts!r}, {self.tail_min!r}")
        if not 0 <= self.tail_fraction <= 1:
            raise ValueError(f"PollPolicy.tail_fraction must be in [0, 1], got {self.tail_fraction!r}")
        if self.max_attempts < 1 or (self.max_polls is not None and self.max_polls < 1):
            raise ValueError("PollPolicy.max_polls and max_attempts must be >= 1")
        if self.retry_base_s < 0 or self.retry_max_s < 0:
            raise ValueError("PollPolicy retry delays must be >= 0")

    @classmethod
    def fixed(cls, interval_s: float, **overrides: Any) -> PollPolicy:
        """A plain poller: every rollout polls every ``interval_s`` seconds, the first ``interval_s`` after creation."""
        return cls(adaptive=False, first_poll_s=interval_s, sparse_fraction=0.0, max_interval_s=interval_s,
                   jitter=0.0, **overrides)

    def sparse_interval(self, elapsed: float, u: float) -> float:
        """Seconds to the next poll on the sparse schedule at ``elapsed``, for a uniform draw ``u`` in [0, 1)."""
        base = min(self.max_interval_s, max(self.first_poll_s, self.sparse_fraction * elapsed))
        return base * (1.0 - self.jitter * u)

    def dense_interval(self, elapsed: float) -> float:
        """Seconds between two polls of the scouts (taking turns), or of a rollout in the step's tail, at
        ``elapsed``."""
        return max(self.min_interval_s, self.dense_fraction * elapsed)

    def due_interval(self, elapsed: float, tail: bool, u: float) -> float:
        """Seconds to the next poll of a rollout past the estimate at ``elapsed``, in the step's tail or not, for a
        uniform draw ``u`` in [0, 1) (the jitter, outside the tail only)."""
        if tail:
            return self.dense_interval(elapsed)
        return max(self.due_interval_s, self.dense_fraction * elapsed) * (1.0 - self.jitter * u)

    def retry_delay(self, n: int, u: float) -> float:
        """Seconds before retry ``n`` (1-based), for a uniform draw ``u`` in [0, 1)."""
        return min(self.retry_max_s, self.retry_base_s * 2 ** min(n - 1, 32)) * (1.0 - self.jitter * u)


@dataclass
class SailStats:
    """Counters of one completer (one RL step): feed `as_metrics()` into the step's metrics.

    ``rollouts`` calls started; ``completed`` returned tokens; ``failed`` raised `SailRolloutError`;
    ``rejected`` raised `SailRequestRejected`; ``attempts`` requests created; ``retries`` attempts after the first;
    ``polls`` GET requests; ``poll_errors`` polls that failed transiently (the response kept being polled);
    ``malformed`` attempts whose answer failed the completion checks (each also in ``failure_reasons`` under
    "malformed output"); ``failure_reasons`` counts each failed attempt's reason (its text before the first
    colon); ``wall_s`` sums the wall time of completed rollouts; ``service_estimate_s`` is the shortest time
    from creation to a final answer seen (the poll schedule's estimate), or None.
    """

    rollouts: int = 0
    completed: int = 0
    failed: int = 0
    rejected: int = 0
    attempts: int = 0
    retries: int = 0
    polls: int = 0
    poll_errors: int = 0
    malformed: int = 0
    wall_s: float = 0.0
    service_estimate_s: float | None = None
    failure_reasons: Counter[str] = field(default_factory=Counter)

    def as_metrics(self, prefix: str = "sail/") -> dict[str, float]:
        """Flat float metrics; ``polls_per_response`` = polls / attempts, ``mean_wall_s`` over completed."""
        names = ("rollouts", "completed", "failed", "rejected", "attempts", "retries", "polls", "poll_errors",
                 "malformed")
        out = {f"{prefix}{name}": float(getattr(self, name)) for name in names}
        out[f"{prefix}polls_per_response"] = self.polls / self.attempts if self.attempts else 0.0
        out[f"{prefix}mean_wall_s"] = self.wall_s / self.completed if self.completed else 0.0
        return out


class _AttemptFailed(SailrlError):
    """One attempt failed in a way a new request may fix."""

    def __init__(self, reason: str, *, malformed: bool = False) -> None:
        reason = re.sub(r"\s+", " ", reason).strip()
        if len(reason) > _REASON_LIMIT:
            reason = reason[: _REASON_LIMIT - 3] + "..."
        super().__init__(reason)
        self.reason = reason
        self.malformed = malformed


class _Malformed(_AttemptFailed):
    def __init__(self, detail: str) -> None:
        super().__init__(f"malformed output: {detail}", malformed=True)


_RETRYABLE_HTTP = frozenset({408, 409, 425, 429})
_PENDING = frozenset({"queued", "in_progress"})
_FINAL_OK = frozenset({"completed", "incomplete"})
_FINAL_BAD = frozenset({"failed", "cancelled", "canceled", "expired"})


def _is_retryable_http(status: int | None) -> bool:
    return status is None or status <= 0 or status >= 500 or status in _RETRYABLE_HTTP


def _is_unparseable_body(exc: InferenceHTTPError) -> bool:
    """True when the SDK reports a 2xx answer whose body is not JSON (e.g. a ``NaN`` logprob)."""
    return str(exc).startswith(_SDK_MALFORMED_BODY)


def _rejected(exc: BaseException, what: str) -> SailRequestRejected:
    status = getattr(exc, "status_code", None)
    if status in (401, 403):
        hint = "Check SAIL_API_KEY (or run `sail auth login`)."
    elif isinstance(exc.__cause__, ValueError) or status is None:
        hint = "Set SAIL_API_KEY (or run `sail auth login`) and, for a custom endpoint, SAIL_API_URL."
    else:
        hint = "Check the model name, completion window and LoRA settings in the spec."
    code = f"HTTP {status}" if status else "no request sent"
    detail = re.sub(r"\s+", " ", str(exc))[:_REASON_LIMIT]
    return SailRequestRejected(f"Sail refused the {what} ({code}): {detail}. {hint}", status_code=status)


async def _bounded(awaitable: Any, seconds: float) -> tuple[bool, Any]:
    """Await ``awaitable`` for at most ``seconds``: (True, result) or (False, None) when the time ran out.

    Like the SDK's own poll, the expiry is detected structurally (the task still pending), so a genuine
    ``sail.TimeoutError`` from the request itself propagates unchanged; cancellation cancels the request.
    """
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=max(seconds, 0.0))
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        return False, None
    return True, task.result()


def _check_completion(
    response: Any, *, max_tokens: int, vocab_size: int | None, logprobs_requested: bool
) -> tuple[list[int], list[float] | None, str]:
    """``(tokens, logprobs or None, stop_reason)`` of a final Sail response, parsed with the sail SDK's helpers.

    Raises `_Malformed` (a failed attempt) when: the output has no ``output_text`` block or the SDK's parser
    refuses it; ``token_ids`` or ``logprobs`` hold more than ``max_tokens`` entries (checked before they are read);
    a token id is a bool, negative, or ``>= vocab_size`` (when given); a logprob is NaN or infinite; logprobs were
    requested and are missing or their count differs from the token count; the completion is empty (no token ids
    and no text).
    """
    try:
        block = sail_tinker._first_output_text(response)
    except InferenceError as exc:
        raise _Malformed(str(exc)) from exc
    for key in ("token_ids", "logprobs"):
        value = block.get(key)
        if isinstance(value, list) and len(value) > max_tokens:
            raise _Malformed(f"{len(value)} entries in {key}, more than max_output_tokens={max_tokens}")
    try:
        tokens, logprobs = sail_tinker._tokens_and_logprobs_from_response(response)
    except InferenceError as exc:
        raise _Malformed(str(exc)) from exc
    if len(tokens) > max_tokens:
        raise _Malformed(f"{len(tokens)} tokens, more than max_output_tokens={max_tokens}")
    for i, token in enumerate(tokens):
        if isinstance(token, bool) or token < 0 or (vocab_size is not None and token >= vocab_size):
            bound = f"[0, {vocab_size})" if vocab_size is not None else "[0, ...)"
            raise _Malformed(f"token id {token!r} at position {i} is outside the vocabulary {bound}")
    if logprobs is not None:
        for i, value in enumerate(logprobs):
            if not math.isfinite(value):
                raise _Malformed(f"logprob {value!r} at position {i} is not a finite number")
    elif logprobs_requested and tokens:
        raise _Malformed(f"logprobs were requested but the answer has none for its {len(tokens)} tokens")
    if not tokens and not block.get("text"):
        raise _Malformed(f"empty completion (no token ids, no text, stop_reason {block.get('stop_reason')!r})")
    return tokens, logprobs, sail_tinker._stop_reason_from_response(response)


class _StepPollState:
    """The poll schedule's state shared by the concurrent rollouts of one completer (one asyncio loop at a time).

    ``estimate_s``: the shortest time from a response's creation to a poll that saw it final. ``in_flight`` /
    ``peak``: responses being waited for now / at most so far. Rollouts whose schedule a new estimate or the start
    of the tail would change sleep on a shared future that `observe_final` and `leave` resolve.
    """

    def __init__(self, policy: PollPolicy) -> None:
        self.policy = policy
        self.estimate_s: float | None = None
        self.last_scout_poll: float | None = None  # time.monotonic() of the scouts' last poll
        self.scout_polls = 0
        self.in_flight = 0
        self.peak = 0
        self._was_tail = False
        self._scout_slots = [False] * (policy.scouts if policy.adaptive else 0)
        self._wake: asyncio.Future[None] | None = None

    def in_tail(self) -> bool:
        """At most ``max(tail_min, tail_fraction * peak)`` responses are still being waited for."""
        return self.in_flight <= max(self.policy.tail_min, self.policy.tail_fraction * self.peak)

    def enter(self) -> int | None:
        """Count a response being waited for; its scout slot (an index) while no response is final, else None."""
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        self._was_tail = self.in_tail()
        if self.estimate_s is not None:
            return None
        for i, busy in enumerate(self._scout_slots):
            if not busy:
                self._scout_slots[i] = True
                return i
        return None

    def leave(self, slot: int | None) -> None:
        """A response is no longer waited for (final, failed or given up); entering the tail wakes sleepers."""
        self.in_flight -= 1
        if slot is not None:
            self._scout_slots[slot] = False
        tail = self.in_tail()
        if tail and not self._was_tail:
            self._wake_all()
        self._was_tail = tail

    def observe_final(self, elapsed: float) -> None:
        """A response was seen final ``elapsed`` seconds after its creation: lower the estimate, wake sleepers."""
        if self.estimate_s is None or elapsed < self.estimate_s:
            self.estimate_s = elapsed
            self._wake_all()

    def _wake_all(self) -> None:
        wake, self._wake = self._wake, None
        if wake is not None and not wake.done() and wake.get_loop() is asyncio.get_running_loop():
            wake.set_result(None)

    async def sleep(self, seconds: float, *, wakeable: bool) -> bool:
        """Sleep ``seconds``; with ``wakeable``, return early (True) when the estimate changes or the tail begins."""
        if seconds <= 0:
            return False
        if not wakeable:
            await asyncio.sleep(seconds)
            return False
        loop = asyncio.get_running_loop()
        if self._wake is None or self._wake.done() or self._wake.get_loop() is not loop:
            self._wake = loop.create_future()
        done, _ = await asyncio.wait({self._wake}, timeout=seconds)
        return bool(done)

    def next_poll(self, elapsed: float, slot: int | None, polls: int, last_poll: float | None,
                  rng: random.Random) -> tuple[float, bool, str]:
        """(seconds to a rollout's next poll, wakeable by a new estimate or the tail, its kind: scout/sparse/
        predicted/overdue/due).

        ``elapsed``: seconds since the rollout's response was created; ``slot``: its scout slot (`enter`);
        ``polls``: its polls so far; ``last_poll``: the elapsed time of its last poll (None before the first);
        ``rng``: the jitter's draws."""
        poll = self.policy
        if not poll.adaptive:
            return poll.sparse_interval(elapsed, rng.random()), False, "sparse"
        if self.estimate_s is not None:
            if last_poll is None or last_poll < self.estimate_s:  # not yet polled at the estimate: do it then
                return self.estimate_s - elapsed, True, "predicted"
            if elapsed < self.estimate_s * (1.0 + poll.overdue_fraction):  # just missed the estimate
                return poll.dense_interval(elapsed), False, "overdue"
            tail = self.in_tail()
            return poll.due_interval(elapsed, tail, rng.random()), not tail, "due"
        if slot is not None:  # the scouts share one schedule: the next poll comes dense_interval after the last
            if polls == 0 or self.last_scout_poll is None:
                return poll.min_interval_s * (slot + 1) - elapsed, True, "scout"
            due_at = self.last_scout_poll + poll.dense_interval(elapsed)
            return due_at - time.monotonic(), True, "scout"
        return poll.sparse_interval(elapsed, rng.random()), True, "sparse"

    def polled(self, kind: str) -> None:
        """A rollout polls now (its kind from `next_poll`): a scout's poll moves the scouts' shared turn on."""
        if kind == "scout":
            self.scout_polls += 1
            self.last_scout_poll = time.monotonic()


class AdaptiveSailCompleter(sail.SailTokenCompleter):
    """`sail.SailTokenCompleter` with a step-shared poll schedule, bounded retries, checked completions and stats.

    Construction is the SDK's own (same arguments, same validation: ``completion_window`` "priority"/"15m"
    are retired and "asap" is refused with the SDK's hint, ``tinker_lora_signed_url`` needs ``adapter_config``;
    errors are ``sail.InvalidArgumentError``, a ValueError), plus ``poll`` (a `PollPolicy`), ``rng`` (a
    ``random.Random`` for the jitter; seed it for reproducible schedules) and ``vocab_size`` (the tokenizer's
    size: token ids at or above it are malformed; None skips that check). ``timeout`` (seconds per HTTP call)
    defaults to ``poll.request_timeout_s``.

    Calling it (``await completer(model_input, stop, max_tokens=None)``) sends the request body
    `build_payload` returns -- byte for byte what the SDK's ``__call__`` sends -- through the SDK's client
    (``sail.inference.responses.create.aio`` / ``retrieve.aio``), and returns the final response, parsed by the
    SDK's helpers and checked (see the module docstring), as ``TokensWithLogprobs(tokens, maybe_logprobs,
    stop_reason)``. ``max_tokens``
    (tinker-cookbook's per-call cap) lowers ``max_output_tokens`` for that call. Raises `SailRolloutError` after
    ``poll.max_attempts`` failed attempts and `SailRequestRejected` at once on a 4xx or a missing key.
    ``stats`` (`SailStats`) counts polls, retries and failures. Concurrent calls share one poll schedule
    (`PollPolicy`), so use one completer per step.
    """

    def __init__(
        self,
        *,
        model: str,
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        completion_window: str = "balanced",
        lora: str | None = None,
        tinker_lora_signed_url: str | None = None,
        adapter_config: Mapping[str, Any] | str | None = None,
        tinker_lora_name: str | None = None,
        metadata: Mapping[str, str] | None = None,
        timeout: float | None = None,
        voyage: Any | None = None,
        request_logprobs: bool = True,
        poll: PollPolicy | None = None,
        rng: random.Random | None = None,
        vocab_size: int | None = None,
    ) -> None:
        self.poll = poll or PollPolicy()
        super().__init__(
            model=model,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            completion_window=completion_window,
            lora=lora,
            tinker_lora_signed_url=tinker_lora_signed_url,
            adapter_config=adapter_config,
            tinker_lora_name=tinker_lora_name,
            metadata=metadata,
            timeout=timeout,
            poll_timeout=self.poll.response_deadline_s,
            voyage=voyage,
            request_logprobs=request_logprobs,
        )
        if vocab_size is not None and (isinstance(vocab_size, bool) or not isinstance(vocab_size, int)
                                       or vocab_size < 1):
            raise InvalidArgumentError(f"vocab_size must be a positive whole number or None, got {vocab_size!r}")
        self.vocab_size = vocab_size
        self.rng = rng or random.Random()
        self.stats = SailStats()
        self._state = _StepPollState(self.poll)

    # -- request body ------------------------------------------------------------------------------
    def build_payload(self, model_input: Any, stop: Any = None, *, max_tokens: int | None = None) -> dict[str, Any]:
        """The JSON body of ``POST /v1/responses`` for one rollout.

        Mirrors ``sail.tinker.SailTokenCompleter.__call__`` (sail 0.17.1) field by field, using the SDK's own
        helpers and constants; ``background: True`` is the keyword the SDK passes to ``create``. A test compares
        the bodies both send to a fake server.
        """
        prompt_tokens = sail_tinker._model_input_to_tokens(model_input)
        limit = self.max_tokens
        if max_tokens is not None:
            if max_tokens <= 0:
                raise InvalidArgumentError("max_tokens must be positive")
            limit = min(limit, max_tokens)
        payload: dict[str, Any] = {
            "model": self.model,
            "input": sail_tinker._RAW_PROMPT_SENTINEL,
            sail_tinker._RAW_PROMPT_TOKENS_FIELD: prompt_tokens,
            "max_output_tokens": limit,
            "temperature": self.temperature,
            "top_p": self.top_p,
        }
        if stop is not None:
            payload["stop"] = sail_tinker._normalize_stop(stop)
        metadata = dict(self.metadata)
        metadata["completion_window"] = self.completion_window
        if self.lora is not None:
            metadata["lora"] = self.lora
        if self.tinker_lora_signed_url is not None:
            metadata["lora"] = self.tinker_lora_signed_url
            metadata[sail_tinker._TINKER_ADAPTER_CONFIG_METADATA_FIELD] = json.dumps(
                sail_tinker._adapter_config_payload(self.adapter_config), sort_keys=True, separators=(",", ":")
            )
            if self.tinker_lora_name is not None:
                metadata[sail_tinker._TINKER_LORA_NAME_METADATA_FIELD] = self.tinker_lora_name
        if metadata:
            payload["metadata"] = metadata
        if self.request_logprobs:
            payload["include"] = [sail_tinker._LOGPROBS_INCLUDE]
        payload["background"] = True
        return payload

    # -- one rollout -------------------------------------------------------------------------------
    async def __call__(self, model_input: Any, stop: Any = None, *, max_tokens: int | None = None) -> Any:
        payload = self.build_payload(model_input, stop, max_tokens=max_tokens)
        stats = self.stats
        stats.rollouts += 1
        started = time.monotonic()
        reasons: list[str] = []
        response_ids: list[str] = []
        for attempt in range(1, self.poll.max_attempts + 1):
            if attempt > 1:
                stats.retries += 1
                await asyncio.sleep(self.poll.retry_delay(attempt - 1, self.rng.random()))
            try:
                response_id = await self._create(payload)
                created = time.monotonic()
                response_ids.append(response_id)
                stats.attempts += 1
                response = await self._wait(response_id, created)
                tokens, logprobs, stop_reason = _check_completion(
                    response, max_tokens=payload["max_output_tokens"], vocab_size=self.vocab_size,
                    logprobs_requested=self.request_logprobs,
                )
            except _AttemptFailed as failure:
                reasons.append(failure.reason)
                stats.failure_reasons[failure.reason.split(":")[0]] += 1
                stats.malformed += failure.malformed
                continue
            except SailRequestRejected:
                stats.rejected += 1
                raise
            stats.completed += 1
            stats.wall_s += time.monotonic() - started
            return TokensWithLogprobs(tokens=tokens, maybe_logprobs=logprobs, stop_reason=stop_reason)
        stats.failed += 1
        raise SailRolloutError(
            f"Sail could not sample this rollout after {self.poll.max_attempts} attempt(s); last failure: "
            f"{reasons[-1]}. All failures: {'; '.join(reasons)}.",
            reasons=reasons,
            attempts=self.poll.max_attempts,
            response_ids=response_ids,
        )

    def _request_timeout(self) -> float:
        return self.timeout if self.timeout is not None else self.poll.request_timeout_s

    async def _create(self, payload: dict[str, Any]) -> str:
        body = dict(payload)
        background = body.pop("background")
        try:
            created = await sail_inference.responses.create.aio(
                voyage=self.voyage, timeout=self._request_timeout(), background=background, **body
            )
        except InferenceHTTPError as exc:
            if _is_unparseable_body(exc):
                raise _Malformed(f"create answer is not JSON ({exc})") from exc
            if _is_retryable_http(exc.status_code):
                raise _AttemptFailed(f"HTTP {exc.status_code} on create: {exc}") from exc
            raise _rejected(exc, "rollout request") from exc
        except InferenceError as exc:
            if isinstance(exc.__cause__, ValueError):  # the SDK's "no API key" path
                raise _rejected(exc, "rollout request") from exc
            raise _AttemptFailed(f"create failed: {exc}") from exc
        except (sail.TimeoutError, sail.TransportError, TimeoutError, ConnectionError) as exc:
            raise _AttemptFailed(f"transport error on create: {exc}") from exc
        try:
            return sail_tinker._response_id_from_create_response(created)
        except InferenceError as exc:
            raise _Malformed(f"create answer: {exc}") from exc

    async def _unparsed_reason(self, response_id: str, remaining: float) -> str | None:
        """What is wrong with a poll answer the SDK could not parse (its JSON parser refuses ``NaN``, and its
        message shows only the body's first 200 characters), named by field: the same response fetched once more
        (``SAIL_API_URL`` + ``/v1/responses/{id}`` with the SDK's key, at most :data:`RAW_BODY_BYTES`, within
        :data:`RAW_FETCH_S` seconds), read with Python's JSON parser, which accepts ``NaN`` and ``Infinity``, and
        put through the completion checks, e.g. "logprob nan at position 0 is not a finite number". None when
        that cannot tell (a custom voyage, no key, the fetch failed, or the body is not JSON at all)."""
        if self.voyage is not None:
            return None
        try:
            config = sail.Config.from_env()
        except Exception:  # noqa: BLE001 -- no key or no endpoint: the SDK's own message stands
            return None
        url = f"{config.api_url.rstrip('/')}/v1/responses/{urllib.parse.quote(response_id, safe='')}"
        headers = {"Accept": "application/json", **({"Authorization": f"Bearer {config.api_key}"}
                                                    if config.api_key else {})}
        timeout = max(min(RAW_FETCH_S, remaining), 0.1)

        def fetch() -> bytes:
            request = urllib.request.Request(url, headers=headers)
            with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310 -- the SDK's endpoint
                return answer.read(RAW_BODY_BYTES + 1)

        try:
            done, body = await _bounded(asyncio.to_thread(fetch), timeout)
            if not done or body is None or len(body) > RAW_BODY_BYTES:
                return None
            parsed = json.loads(body)
        except (OSError, ValueError, RecursionError, urllib.error.URLError):
            return None
        if not isinstance(parsed, dict) or parsed.get("status") not in _FINAL_OK:
            return None
        try:
            _check_completion(parsed, max_tokens=int(self.max_tokens), vocab_size=self.vocab_size,
                              logprobs_requested=self.request_logprobs)
        except _Malformed as exc:
            return exc.reason.removeprefix("malformed output: ")
        except Exception:  # noqa: BLE001 -- a body the checks cannot read: the SDK's own message stands
            return None
        return None

    async def _wait(self, response_id: str, created: float) -> dict[str, Any]:
        poll = self.poll
        state = self._state
        deadline = created + poll.response_deadline_s
        slot = state.enter()
        polls = 0
        last_poll: float | None = None
        try:
            while poll.max_polls is None or polls < poll.max_polls:
                now = time.monotonic()
                remaining = deadline - now
                if remaining <= 0:
                    break
                delay, wakeable, kind = state.next_poll(now - created, slot, polls, last_poll, self.rng)
                scout_polls = state.scout_polls
                if await state.sleep(min(delay, remaining), wakeable=wakeable):
                    continue  # a new estimate or the tail began: recompute this rollout's next poll
                if kind == "scout" and state.scout_polls != scout_polls and polls:
                    continue  # another scout polled meanwhile: this one's turn moves on
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                polls += 1
                last_poll = time.monotonic() - created
                state.polled(kind)
                self.stats.polls += 1
                retrieve = sail_inference.responses.retrieve.aio(
                    response_id, voyage=self.voyage, timeout=min(self._request_timeout(), remaining)
                )
                try:
                    finished, response = await _bounded(retrieve, remaining)
                except InferenceHTTPError as exc:
                    if _is_unparseable_body(exc):
                        named = await self._unparsed_reason(response_id, remaining)
                        raise _Malformed(named or f"poll answer is not JSON ({exc})") from exc
                    if exc.status_code == 404:
                        raise _AttemptFailed(f"HTTP 404: response {response_id} not found") from exc
                    if _is_retryable_http(exc.status_code):
                        self.stats.poll_errors += 1
                        continue
                    raise _rejected(exc, "poll") from exc
                except (InferenceError, sail.TimeoutError, sail.TransportError, TimeoutError, ConnectionError):
                    self.stats.poll_errors += 1
                    continue
                if not finished:
                    break
                status = response.get("status") if isinstance(response, dict) else None
                answered = response.get("id") if isinstance(response, dict) else None
                if answered is not None and answered != response_id:
                    raise _Malformed(f"poll answer is for response {_short(answered)}, not {response_id}")
                if status in _FINAL_OK:
                    if poll.adaptive:
                        state.observe_final(time.monotonic() - created)
                        self.stats.service_estimate_s = state.estimate_s
                    return response
                if status in _FINAL_BAD:
                    error = response.get("error") if isinstance(response, dict) else None
                    detail = error.get("message") if isinstance(error, dict) else None
                    raise _AttemptFailed(f"status {status}" + (f": {detail}" if detail else ""))
                if not isinstance(response, dict) or status is None:
                    raise _Malformed(f"poll answer has no status (response {response_id})")
                if not isinstance(status, str) or status not in _PENDING:
                    raise _Malformed(f"poll answer has status {_short(status)}, none of "
                                     f"{', '.join(sorted(_PENDING | _FINAL_OK | _FINAL_BAD))} (response {response_id})")

        finally:
            state.leave(slot)
        limits = f"{poll.response_deadline_s:g} s" + (f" / {poll.max_polls} polls" if poll.max_polls else "")
        raise _AttemptFailed(f"timeout: response {response_id} not finished after {limits}")


def completion_window_problem(completion_window: str) -> str | None:
    """The sail SDK's complaint about ``completion_window`` (e.g. "priority" is retired), or None if it accepts it.

    Runs the SDK's own constructor check (``sail.SailTokenCompleter``), so the answer is what a run's completer
    would raise. The SDK refuses only "", "asap", "priority" and "15m"; a name it accepts may still be unknown to
    the service: the spec's table of windows (``sailrl.spec.constants.COMPLETION_WINDOWS``, ``RETIRED_WINDOWS``)
    is what validation checks, and a test checks that table against this function.
    """
    try:
        sail.SailTokenCompleter(model="check", max_tokens=1, completion_window=completion_window)
    except InvalidArgumentError as exc:
        return str(exc)
    return None


def make_sail_policy(
    *,
    model: str,
    signed_url: str,
    adapter_config: Mapping[str, Any],
    lora_name: str,
    max_tokens: int,
    temperature: float,
    top_p: float,
    completion_window: str,
    vocab_size: int | None = None,
    poll_deadline_s: float | None = None,
    poll: PollPolicy | None = None,
    rng: random.Random | None = None,
) -> AdaptiveSailCompleter:
    """The per-step rollout policy: an `AdaptiveSailCompleter` sampling ``model`` with the LoRA at ``signed_url``.

    ``adapter_config`` is `adapter_config_for(...)`'s result; ``lora_name`` labels the checkpoint on Sail
    (``metadata.tinker_lora_name``); ``vocab_size`` is the tokenizer's size (token ids at or above it are
    malformed); ``poll_deadline_s`` (the spec's ``sampling.poll_deadline_s``, seconds) replaces the poll
    policy's ``response_deadline_s``. Raises ``sail.InvalidArgumentError`` (a ValueError) for arguments the SDK
    refuses and ValueError for a deadline that is not a positive number. Catch `SailRolloutError` per group; let
    `SailRequestRejected` stop the run; read ``.stats`` after the step.
    """
    policy = poll or PollPolicy()
    if poll_deadline_s is not None:
        policy = replace(policy, response_deadline_s=poll_deadline_s)
    return AdaptiveSailCompleter(
        model=model,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        completion_window=completion_window,
        tinker_lora_signed_url=signed_url,
        adapter_config=adapter_config,
        tinker_lora_name=lora_name,
        poll=policy,
        rng=rng,
        vocab_size=vocab_size,
    )
