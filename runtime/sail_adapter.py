"""Sampling rollouts on Sail from Tinker sampler checkpoints.

- `adapter_config_for(...)`: the PEFT ``adapter_config`` that describes the LoRA Tinker trains, derived from the
  spec's LoRA settings (no hand-written JSON file).
- `AdaptiveSailCompleter`: a tinker-cookbook ``TokenCompleter`` that sends exactly the request
  `sail.SailTokenCompleter` sends (same payload, same sail HTTP client, same response parsing), but polls the
  background response adaptively instead of every 20 s, retries failed responses a bounded number of times and
  then raises `SailRolloutError` so the loop can drop the group.
- `signed_checkpoint_url(...)`: the signed archive URL of a Tinker sampler checkpoint, via
  `sail.get_tinker_checkpoint_signed_url_async`.
- `make_sail_policy(...)`: the per-step factory the RL loop calls.

The sail SDK reads ``SAIL_API_URL`` and ``SAIL_API_KEY`` (or ``~/.sail``) once per process;
``sail.reset_transports()`` re-reads them.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import sail
import sail.inference as sail_inference
import sail.tinker as sail_tinker
from sail.errors import InferenceError, InferenceHTTPError, InvalidArgumentError
from tinker_cookbook.completers import TokensWithLogprobs

__all__ = [
    "TINKER_DEFAULT_LORA_ALPHA",
    "AdaptiveSailCompleter",
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
]

# ---------------------------------------------------------------------------------------------------------
# adapter_config
# ---------------------------------------------------------------------------------------------------------

#: Tinker's LoRA alpha. Tinker's API takes no alpha (``tinker.types.LoraConfig`` has rank, seed, train_unembed,
#: train_mlp, train_attn only; Tinker docs, seeds/004). 32 is the value tinker-cookbook documents as the default
#: (``tinker_cookbook/weights/README.md``, "LoRA Rank and Alpha": ``lora_alpha`` default 32;
#: ``hyperparam_utils.get_lora_lr_over_full_finetune_lr(..., lora_alpha=32)``), the "LoRA Without Regret" post
#: Tinker's LoRA follows uses alpha 32, and tinker-cookbook issue #280 ("What is the default lora_alpha used?") has
#: no other answer. The archive Tinker writes carries its own ``adapter_config.json`` with the real value; pass
#: ``lora_alpha=`` to `adapter_config_for` if it ever differs.
TINKER_DEFAULT_LORA_ALPHA = 32

# Leaf module names (PEFT ``target_modules``) per model family. Tinker's adapter keys are the Hugging Face
# parameter names (``tinker_cookbook.weights._adapter`` keeps them, remapping only ``unembed_tokens`` ->
# ``lm_head`` and the 3-D expert tensors ``w1/w3/w2`` -> ``gate_proj/up_proj/down_proj``), and
# ``_add_peft_weight`` writes the leaf name of each into ``target_modules``.
_STANDARD_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
# DeepSeek-V3 / Kimi-K2 multi-head latent attention (HF DeepseekV3Attention with q_lora_rank set).
_MLA_ATTN = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")
_GATED_MLP = ("gate_proj", "up_proj", "down_proj")  # dense MLPs, MoE experts and shared experts alike
_UNEMBED = ("lm_head",)

_FAMILIES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "mla": (_MLA_ATTN, _GATED_MLP),
    "standard": (_STANDARD_ATTN, _GATED_MLP),
}
# Lower-cased substrings of the base model name -> family; first match wins.
_FAMILY_PATTERNS: tuple[tuple[str, str], ...] = (
    ("kimi-k2", "mla"),
    ("deepseek-v3", "mla"),
    ("llama", "standard"),
    ("qwen3-", "standard"),  # Qwen3 dense and MoE (not Qwen3.5/3.6, whose linear attention differs)
    ("qwen2", "standard"),
    ("gpt-oss", "standard"),
    ("sailrl/tiny", "standard"),
)


def lora_family(base_model: str) -> str | None:
    """The module-naming family of ``base_model`` ("mla" or "standard"), or None when it is not known.

    Unknown models get the standard Llama/Qwen names from `adapter_config_for`; a spec checker can warn with this.
    """
    name = base_model.lower()
    for pattern, family in _FAMILY_PATTERNS:
        if pattern in name:
            return family
    return None


def adapter_config_for(
    base_model: str,
    lora_rank: int,
    *,
    train_attn: bool,
    train_mlp: bool,
    train_unembed: bool,
    lora_alpha: int | None = None,
) -> dict[str, Any]:
    """The PEFT ``adapter_config.json`` contents for the LoRA Tinker trains on ``base_model``.

    Sail needs it with every request that samples a Tinker checkpoint (``metadata.tinker_adapter_config``).
    Keys and fixed values are those tinker-cookbook writes when it converts a Tinker adapter to PEFT
    (``tinker_cookbook.weights._adapter._build_peft_config``): ``peft_type`` "LORA", ``task_type`` "CAUSAL_LM",
    ``bias`` "none", ``lora_dropout`` 0.0, ``inference_mode`` True, empty rank/alpha patterns.
    ``r`` = ``lora_rank`` (``tinker.types.LoraConfig.rank``); ``lora_alpha`` = `TINKER_DEFAULT_LORA_ALPHA`
    unless given (see there for the source). ``target_modules`` = the leaf module names of the enabled parts:
    attention (``train_attn``), MLP and MoE experts (``train_mlp``) and the unembedding ``lm_head``
    (``train_unembed``) -- the three switches of ``tinker.types.LoraConfig`` -- named per model family
    (`lora_family`; unknown models get the standard Llama/Qwen names). ``base_model_name_or_path`` =
    ``base_model``, as Sail's LoRA guide asks.

    Raises ValueError when ``lora_rank`` or ``lora_alpha`` is not a positive integer or every switch is off.
    The result is accepted by ``peft.LoraConfig(**config)``.
    """
    if isinstance(lora_rank, bool) or not isinstance(lora_rank, int) or lora_rank <= 0:
        raise ValueError(f"LoRA rank must be a positive whole number, got {lora_rank!r}.")
    alpha = TINKER_DEFAULT_LORA_ALPHA if lora_alpha is None else lora_alpha
    if isinstance(alpha, bool) or not isinstance(alpha, int) or alpha <= 0:
        raise ValueError(f"LoRA alpha must be a positive whole number, got {lora_alpha!r}.")
    if not (train_attn or train_mlp or train_unembed):
        raise ValueError(
            "The LoRA trains nothing: train_attn, train_mlp and train_unembed are all false. Turn at least one on."
        )
    attn, mlp = _FAMILIES[lora_family(base_model) or "standard"]
    modules: list[str] = []
    if train_attn:
        modules += attn
    if train_mlp:
        modules += mlp
    if train_unembed:
        modules += _UNEMBED
    return {
        "peft_type": "LORA",
        "auto_mapping": None,
        "base_model_name_or_path": base_model,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "r": lora_rank,
        "rank_pattern": {},
        "alpha_pattern": {},
        "target_modules": sorted(set(modules)),
        "task_type": "CAUSAL_LM",
    }


# ---------------------------------------------------------------------------------------------------------
# errors, polling policy, stats
# ---------------------------------------------------------------------------------------------------------


class SailRolloutError(RuntimeError):
    """One rollout could not be sampled on Sail within the bounded retries; drop its group and count it.

    Attributes: ``reason`` (the last failure, e.g. "status failed", "HTTP 500", "timeout"), ``reasons`` (one per
    attempt), ``attempts``, ``response_ids`` (the Sail responses created, for support requests).
    """

    def __init__(self, message: str, *, reasons: list[str], attempts: int, response_ids: list[str]) -> None:
        super().__init__(message)
        self.reasons = list(reasons)
        self.reason = reasons[-1] if reasons else "unknown"
        self.attempts = attempts
        self.response_ids = list(response_ids)


class SailRequestRejected(RuntimeError):
    """Sail refused the request itself (HTTP 4xx such as a bad key or an unknown model, or no API key set).

    Retrying cannot help and every rollout would fail the same way, so this is deliberately NOT a
    `SailRolloutError`: the run should stop with this message. ``status_code`` is the HTTP status (None when the
    SDK refused before sending).
    """

    def __init__(self, message: str, *, status_code: int | None) -> None:
        super().__init__(message)
        self.status_code = status_code


class SailCheckpointError(RuntimeError):
    """A signed download URL for a Tinker checkpoint could not be obtained."""


@dataclass(frozen=True)
class PollPolicy:
    """How `AdaptiveSailCompleter` waits for one background response and retries failed ones.

    Poll k (k = 0, 1, ...) happens ``min(max_interval_s, first_poll_s * backoff**k) * (1 - jitter * u)`` seconds
    after the previous one (after the create for k = 0), u uniform in [0, 1): exponential backoff with jitter,
    so the first poll is within ``first_poll_s`` and concurrent rollouts do not poll in lockstep. A response
    that is not final after ``response_deadline_s`` seconds or ``max_polls`` polls counts as a timeout.
    A failed attempt (status failed/cancelled/expired, HTTP 5xx/429/408, transport error, timeout, malformed
    output) is retried with a new request after ``min(retry_max_s, retry_base_s * 2**(n-1)) * (1 - jitter * u)``
    seconds, up to ``max_attempts`` attempts in all. ``request_timeout_s`` bounds each HTTP call (seconds).
    """

    first_poll_s: float = 0.25
    backoff: float = 2.0
    max_interval_s: float = 4.0
    jitter: float = 0.25
    response_deadline_s: float = 20 * 60.0  # the SDK's own poll_timeout default
    max_polls: int = 1000
    max_attempts: int = 3
    retry_base_s: float = 1.0
    retry_max_s: float = 30.0
    request_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        positive = ("first_poll_s", "max_interval_s", "response_deadline_s", "request_timeout_s")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"PollPolicy.{name} must be > 0, got {getattr(self, name)!r}")
        if self.backoff < 1:
            raise ValueError(f"PollPolicy.backoff must be >= 1, got {self.backoff!r}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"PollPolicy.jitter must be in [0, 1), got {self.jitter!r}")
        if self.max_polls < 1 or self.max_attempts < 1:
            raise ValueError("PollPolicy.max_polls and max_attempts must be >= 1")
        if self.retry_base_s < 0 or self.retry_max_s < 0:
            raise ValueError("PollPolicy retry delays must be >= 0")

    def poll_interval(self, k: int, u: float) -> float:
        """Seconds before poll ``k`` (0-based), for a uniform draw ``u`` in [0, 1)."""
        base = min(self.max_interval_s, self.first_poll_s * self.backoff ** min(k, 64))
        return base * (1.0 - self.jitter * u)

    def retry_delay(self, n: int, u: float) -> float:
        """Seconds before retry ``n`` (1-based), for a uniform draw ``u`` in [0, 1)."""
        return min(self.retry_max_s, self.retry_base_s * 2 ** min(n - 1, 32)) * (1.0 - self.jitter * u)


@dataclass
class SailStats:
    """Counters of one completer (one RL step): feed `as_metrics()` into the step's metrics.

    ``rollouts`` calls started; ``completed`` returned tokens; ``failed`` raised `SailRolloutError`;
    ``rejected`` raised `SailRequestRejected`; ``attempts`` requests created; ``retries`` attempts after the first;
    ``polls`` GET requests; ``poll_errors`` polls that failed transiently (the response kept being polled);
    ``failure_reasons`` counts each failed attempt's reason; ``wall_s`` sums the wall time of completed rollouts.
    """

    rollouts: int = 0
    completed: int = 0
    failed: int = 0
    rejected: int = 0
    attempts: int = 0
    retries: int = 0
    polls: int = 0
    poll_errors: int = 0
    wall_s: float = 0.0
    failure_reasons: Counter[str] = field(default_factory=Counter)

    def as_metrics(self, prefix: str = "sail/") -> dict[str, float]:
        """Flat float metrics; ``polls_per_response`` = polls / attempts, ``mean_wall_s`` over completed."""
        out = {
            f"{prefix}{name}": float(getattr(self, name))
            for name in ("rollouts", "completed", "failed", "rejected", "attempts", "retries", "polls", "poll_errors")
        }
        out[f"{prefix}polls_per_response"] = self.polls / self.attempts if self.attempts else 0.0
        out[f"{prefix}mean_wall_s"] = self.wall_s / self.completed if self.completed else 0.0
        return out


class _AttemptFailed(Exception):
    """One attempt failed in a way a new request may fix."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_RETRYABLE_HTTP = frozenset({408, 409, 425, 429})
_FINAL_OK = frozenset({"completed", "incomplete"})
_FINAL_BAD = frozenset({"failed", "cancelled", "canceled", "expired"})


def _is_retryable_http(status: int | None) -> bool:
    return status is None or status <= 0 or status >= 500 or status in _RETRYABLE_HTTP


def _rejected(exc: BaseException, what: str) -> SailRequestRejected:
    status = getattr(exc, "status_code", None)
    if status in (401, 403):
        hint = "Check SAIL_API_KEY (or run `sail auth login`)."
    elif isinstance(exc.__cause__, ValueError) or status is None:
        hint = "Set SAIL_API_KEY (or run `sail auth login`) and, for a custom endpoint, SAIL_API_URL."
    else:
        hint = "Check the model name, completion window and LoRA settings in the spec."
    code = f"HTTP {status}" if status else "no request sent"
    return SailRequestRejected(f"Sail refused the {what} ({code}): {exc}. {hint}", status_code=status)


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


# ---------------------------------------------------------------------------------------------------------
# the completer
# ---------------------------------------------------------------------------------------------------------


class AdaptiveSailCompleter(sail.SailTokenCompleter):
    """`sail.SailTokenCompleter` with adaptive polling, bounded retries and per-completer stats.

    Construction is the SDK's own (same arguments, same validation: ``completion_window`` "priority"/"15m"
    are retired and "asap" is refused with the SDK's hint, ``tinker_lora_signed_url`` needs ``adapter_config``;
    errors are ``sail.InvalidArgumentError``, a ValueError), plus ``poll`` (a `PollPolicy`) and ``rng`` (a
    ``random.Random`` for the jitter; seed it for reproducible schedules). ``timeout`` (seconds per HTTP call)
    defaults to ``poll.request_timeout_s``.

    Calling it (``await completer(model_input, stop, max_tokens=None)``) sends the request body
    `build_payload` returns -- byte for byte what the SDK's ``__call__`` sends -- through the SDK's client
    (``sail.inference.responses.create.aio`` / ``retrieve.aio``), and parses the final response with the SDK's
    helpers into ``TokensWithLogprobs(tokens, maybe_logprobs, stop_reason)``. ``max_tokens`` (tinker-cookbook's
    per-call cap) lowers ``max_output_tokens`` for that call. Raises `SailRolloutError` after
    ``poll.max_attempts`` failed attempts and `SailRequestRejected` at once on a 4xx or a missing key.
    ``stats`` (`SailStats`) counts polls, retries and failures.
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
        self.rng = rng or random.Random()
        self.stats = SailStats()

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
                response_ids.append(response_id)
                stats.attempts += 1
                response = await self._wait(response_id)
                try:
                    tokens, logprobs = sail_tinker._tokens_and_logprobs_from_response(response)
                except InferenceError as exc:
                    raise _AttemptFailed(f"malformed output: {exc}") from exc
            except _AttemptFailed as failure:
                reasons.append(failure.reason)
                stats.failure_reasons[failure.reason.split(":")[0]] += 1
                continue
            except SailRequestRejected:
                stats.rejected += 1
                raise
            stats.completed += 1
            stats.wall_s += time.monotonic() - started
            return TokensWithLogprobs(
                tokens=tokens,
                maybe_logprobs=logprobs,
                stop_reason=sail_tinker._stop_reason_from_response(response),
            )
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
            raise _AttemptFailed(f"create answer malformed: {exc}") from exc

    async def _wait(self, response_id: str) -> dict[str, Any]:
        poll = self.poll
        deadline = time.monotonic() + poll.response_deadline_s
        for k in range(poll.max_polls):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await asyncio.sleep(min(poll.poll_interval(k, self.rng.random()), remaining))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self.stats.polls += 1
            retrieve = sail_inference.responses.retrieve.aio(
                response_id, voyage=self.voyage, timeout=min(self._request_timeout(), remaining)
            )
            try:
                finished, response = await _bounded(retrieve, remaining)
            except InferenceHTTPError as exc:
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
            if status in _FINAL_OK:
                return response
            if status in _FINAL_BAD:
                error = response.get("error") if isinstance(response, dict) else None
                detail = error.get("message") if isinstance(error, dict) else None
                raise _AttemptFailed(f"status {status}" + (f": {detail}" if detail else ""))
        raise _AttemptFailed(
            f"timeout: response {response_id} not finished after {poll.response_deadline_s:g} s / "
            f"{poll.max_polls} polls"
        )


# ---------------------------------------------------------------------------------------------------------
# helpers for the loop and the spec checker
# ---------------------------------------------------------------------------------------------------------


def completion_window_problem(completion_window: str) -> str | None:
    """The sail SDK's own complaint about ``completion_window`` (e.g. "priority" is retired), or None if accepted.

    Runs the SDK's constructor validation, so the answer cannot drift from what a run would hit.
    """
    try:
        sail.SailTokenCompleter(model="check", max_tokens=1, completion_window=completion_window)
    except InvalidArgumentError as exc:
        return str(exc)
    return None


_ARCHIVE_URL_METHOD = "get_checkpoint_archive_url_from_tinker_path_async"


def tinker_rest_client_class() -> type:
    """The SDK's RestClient class: ``tinker.RestClient`` where exported (0.36+), else its defining module."""
    import tinker

    cls = getattr(tinker, "RestClient", None)
    if cls is None:
        from tinker.lib.public_interfaces.rest_client import RestClient as cls
    return cls


def signed_url_problem(rest_client_cls: type | None = None) -> str | None:
    """Why ``sail.get_tinker_checkpoint_signed_url_async`` cannot work with the installed tinker, or None.

    sail 0.17.1 asks Tinker's RestClient for ``get_checkpoint_archive_url_from_tinker_path_async``; tinker 0.36
    and later no longer have it (0.35.0 does). ``rest_client_cls`` defaults to ``tinker.RestClient``.
    """
    if rest_client_cls is None:
        rest_client_cls = tinker_rest_client_class()
    if callable(getattr(rest_client_cls, _ARCHIVE_URL_METHOD, None)):
        return None
    import importlib.metadata as md

    try:
        version = md.version("tinker")
    except md.PackageNotFoundError:  # pragma: no cover - tinker is a dependency
        version = "unknown"
    return (
        f"The installed tinker ({version}) has no RestClient.{_ARCHIVE_URL_METHOD}, which sail "
        f"{md.version('sail')} needs to give Sail a signed link to each Tinker checkpoint. Install a tinker "
        "that has it (tinker 0.35.0 does; 0.36.0 and later do not), or a sail release that supports this tinker."
    )


async def signed_checkpoint_url(service_client: Any, tinker_path: str, ttl_seconds: int | None) -> str:
    """The signed archive URL (https) Sail downloads the Tinker checkpoint ``tinker_path`` from.

    Wraps ``sail.get_tinker_checkpoint_signed_url_async(service_client, tinker_path, ttl_seconds=...)``: with
    ``ttl_seconds`` (a positive number of seconds, or None for no expiry) Tinker is first told to delete the
    checkpoint after that long, so per-step checkpoints clean themselves up. Raises `SailCheckpointError` (plain
    words, with the cause) when the Tinker client lacks the methods or Tinker cannot give a URL.
    """
    if ttl_seconds is not None and (isinstance(ttl_seconds, bool) or ttl_seconds <= 0):
        raise ValueError(f"ttl_seconds must be a positive number of seconds or None, got {ttl_seconds!r}")
    try:
        return await sail.get_tinker_checkpoint_signed_url_async(
            service_client, tinker_path, ttl_seconds=ttl_seconds
        )
    except InferenceError as exc:
        problem = None
        if _ARCHIVE_URL_METHOD in str(exc):
            rest = service_client.create_rest_client()
            problem = signed_url_problem(type(rest))
        raise SailCheckpointError(
            f"Could not get a download link for the Tinker checkpoint {tinker_path}: {problem or exc}"
        ) from exc
    except Exception as exc:  # Tinker's own API errors (tinker.APIError, connection errors)
        raise SailCheckpointError(
            f"Tinker could not give a download link for the checkpoint {tinker_path}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


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
    poll: PollPolicy | None = None,
    rng: random.Random | None = None,
) -> AdaptiveSailCompleter:
    """The per-step rollout policy: an `AdaptiveSailCompleter` sampling ``model`` with the LoRA at ``signed_url``.

    ``adapter_config`` is `adapter_config_for(...)`'s result; ``lora_name`` labels the checkpoint on Sail
    (``metadata.tinker_lora_name``). Raises ``sail.InvalidArgumentError`` (a ValueError) for arguments the SDK
    refuses. Catch `SailRolloutError` per group; let `SailRequestRejected` stop the run; read ``.stats`` after.
    """
    return AdaptiveSailCompleter(
        model=model,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        completion_window=completion_window,
        tinker_lora_signed_url=signed_url,
        adapter_config=adapter_config,
        tinker_lora_name=lora_name,
        poll=poll,
        rng=rng,
    )
