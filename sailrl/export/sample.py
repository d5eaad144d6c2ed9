"""Sample a run's trained policy and score the completions with its spec's reward rules (``sailrl sample``).

The prompt is a dataset row rendered with the spec's prompt template (``row``), or a user turn given as text
(``prompt``; the template is not applied). Either way it is built with the run's renderer, and sampled with the
run's ``sampling:`` settings (``max_tokens``, ``temperature``, ``top_p``, stop sequences) unless overridden:
from the checkpoint's sampling client — the embedded backend's for a ``local://`` checkpoint, Tinker's
``ServiceClient.create_sampling_client`` for a ``tinker://`` one (``TINKER_API_KEY``). Each completion's text is
what the rules read during training (``rollout.completion_text``), scored with ``RewardFunction.trace``.

Every method's run samples the same way. A spec without reward rules (``method: dpo``, an SFT or distillation
spec without ``reward:``) has nothing to score with: its completions come back with no verdicts
(``SampleResult.scored`` False). An SFT spec whose rows hold whole conversations (``sft.messages_field``) has no
prompt template: ``row`` takes the row's messages before its last assistant turn.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, field
from typing import Any

from sailrl.export.build import local_checkpoint_directory, quiet_progress_bars
from sailrl.export.runinfo import Checkpoint, ExportError, RunInfo
from sailrl.runtime.backends.backend import check_keys, local_checkpoint_dir
from sailrl.runtime.backends.tinker_service import service_client
from sailrl.runtime.data import dataset_row
from sailrl.runtime.prompts import PromptBuilder
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.spec.errors import UserError
from sailrl.spec.models import context_window
from sailrl.spec.rewards import RewardSpec
from sailrl.spec.schema import Spec

#: Seconds a sampling request may take before ``sailrl sample`` gives up.
SAMPLE_TIMEOUT_S = 600.0


@dataclass
class Sampled:
    """One completion: ``text`` (what the rules read), ``tokens``, ``truncated`` (cut at max_tokens), its
    ``score`` and per-rule ``traces``."""

    text: str
    tokens: list[int]
    truncated: bool
    score: Any
    traces: list[Any]


@dataclass
class SampleResult:
    messages: list[dict[str, str]]
    fields: dict[str, Any]
    reference_problem: str | None
    reward_fn: Any
    completions: list[Sampled] = field(default_factory=list)
    scored: bool = True  # False: the spec has no reward rules, so nothing scored the completions


def row_messages(spec: Spec, builder: PromptBuilder | None, values: dict[str, Any]) -> list[dict[str, str]]:
    """The messages a dataset row prompts with: the spec's template over it, or (an SFT spec whose rows hold whole
    conversations) the row's messages before its last assistant turn."""
    if builder is not None:
        return builder.messages(values)
    field_name = spec.sft.messages_field if spec.sft is not None else None
    chat = values.get(field_name) if field_name else None
    if not isinstance(chat, list) or not all(isinstance(m, dict) for m in chat):
        raise ExportError(f"this row's {field_name} is not a list of {{role, content}} messages: take another row "
                          "or give the prompt with --prompt TEXT")
    last = max((i for i, m in enumerate(chat) if m.get("role") == "assistant"), default=len(chat))
    return [{"role": str(m.get("role")), "content": str(m.get("content"))} for m in chat[:last]]


def _renderer(spec: Spec, spec_dir: Any) -> tuple[Any, Any]:
    tokenizer, renderer, _ = renderer_for(spec, spec_dir)
    return tokenizer, renderer


def renderer_for(spec: Spec, spec_dir: Any) -> tuple[Any, Any, str]:
    """``(tokenizer, renderer, renderer name)`` the run built its prompts with; :class:`ExportError` (one line)
    when they cannot be built here."""
    # lazy: runtime.backends.models loads torch and transformers (seconds); bad arguments are reported before
    from sailrl.runtime.backends.models import default_renderer_name, get_renderer, get_tokenizer

    try:
        tokenizer = get_tokenizer(spec.model.name, spec_dir)
        name = spec.model.renderer or default_renderer_name(spec.model.name, spec_dir,
                                                            embedded=spec.sampling.sampler == "local")
        if name is None:
            raise ExportError(f"no renderer is known for model '{spec.model.name}'; set model.renderer")
        return tokenizer, get_renderer(name, tokenizer), name
    except UserError:
        raise
    except (OSError, ValueError) as exc:
        raise ExportError(f"cannot build the tokenizer of '{spec.model.name}' here: "
                          f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None


def _sampling_client(spec: Spec, ckpt: Checkpoint, spec_dir: Any, have: str) -> Any:
    if ckpt.is_local:
        # lazy: runtime.backends.local loads torch and transformers (seconds); a bad run or checkpoint is reported first
        from sailrl.runtime.backends.local import LocalServiceClient
        from sailrl.runtime.backends.local.weights.sources import BaseModelError  # lazy: see above

        directory = local_checkpoint_directory(ckpt, have)
        service = LocalServiceClient(spec.model.name, base_dir=local_checkpoint_dir(), seed=spec.model.seed,
                                     model_dir=spec_dir)
        try:  # by its folder: a step's checkpoint is training state (weights/), which a local:// sampler refuses
            return service, service.create_sampling_client(model_path=directory)
        except BaseModelError as exc:
            service.close("error")
            raise ExportError(f"cannot load the base model the run trained on: {exc}") from None
    check_keys("tinker")
    try:
        service = service_client()  # TINKER_BASE_URL's server; the SDK is imported only now
        return service, service.create_sampling_client(model_path=ckpt.path)
    except Exception as exc:  # noqa: BLE001 -- an expired checkpoint, a refused key: one line
        raise ExportError(f"Tinker cannot sample {ckpt.path}: {exc}. A checkpoint is deleted when its TTL ends "
                          f"(training.checkpoint_ttl_s); {have}") from None


async def _sample(client: Any, model_input: Any, n: int, params: Any) -> Any:
    return await asyncio.wait_for(
        client.sample_async(prompt=model_input, num_samples=n, sampling_params=params), SAMPLE_TIMEOUT_S)


def sample_run(run: RunInfo, ckpt: Checkpoint, *, prompt: str | None = None, row: int | None = None,
               fields: dict[str, Any] | None = None, n: int = 4, temperature: float | None = None,
               max_tokens: int | None = None, seed: int | None = None) -> SampleResult:
    """Sample ``n`` completions of ``ckpt`` for a prompt and score them (see the module docstring)."""
    import tinker  # lazy: tinker takes seconds; bad arguments are reported before

    # lazy: runtime.rollouts loads tinker (seconds); see above
    from sailrl.runtime.rollouts.rollout import completion_text

    if (prompt is None) == (row is None):
        raise ExportError("give the prompt as --prompt TEXT or take it from the data with --row N (one of them)")
    quiet_progress_bars()
    spec = run.spec()
    spec_dir = run.spec_dir
    tokenizer, renderer = _renderer(spec, spec_dir)
    builder = PromptBuilder(spec.prompt, renderer) if spec.prompt is not None else None
    values: dict[str, Any] = {}
    if row is not None:
        try:
            values, note = dataset_row(spec, spec_dir, row)
        except LookupError as exc:
            raise ExportError(str(exc)) from None
        if note:
            print(f"note: {note}", file=sys.stderr)
        messages = row_messages(spec, builder, values)
    else:
        messages = [{"role": "user", "content": str(prompt)}]
    values = {**values, **(fields or {})}
    model_input = renderer.build_generation_prompt(messages)
    window = context_window(spec.model.name, spec_dir)[0]
    if window is not None and model_input.length >= window:  # the sampler refuses it (a traceback, exit 70)
        raise ExportError(f"the prompt is {model_input.length} tokens, which fills the context window of "
                          f"{spec.model.name} ({window} tokens): shorten it")
    stop = spec.sampling.stop or list(renderer.get_stop_sequences())
    params = tinker.SamplingParams(
        max_tokens=max_tokens or spec.sampling.max_tokens,
        temperature=spec.sampling.temperature if temperature is None else temperature,
        top_p=spec.sampling.top_p, stop=stop, seed=seed)
    rules = spec.reward or RewardSpec.model_construct(rules=[])  # no rules: nothing scores the completions
    reward_fn = RewardFunction.from_spec(rules, spec.prompt.reference_field if spec.prompt else "answer", spec_dir)
    if reward_fn.judges:  # kind: judge rules score the samples with their judge, as in the run
        from sailrl.runtime.backends.judge_clients import connect_judges  # lazy: only specs with judge rules need it

        for name, why in connect_judges(reward_fn, spec_dir=spec_dir).items():
            print(f"warning: judge rule '{name}': {why}", file=sys.stderr)
    service, client = _sampling_client(spec, ckpt, spec_dir, run._have())
    try:
        response = asyncio.run(_sample(client, model_input, n, params))
    except TimeoutError:
        raise ExportError(f"sampling {ckpt.path} took more than {SAMPLE_TIMEOUT_S:.0f} s; try again") from None
    finally:
        close = getattr(service, "close", None)
        if ckpt.is_local and callable(close):
            close("done")
    result = SampleResult(messages, values, reward_fn.reference_problem(values) if spec.reward else None, reward_fn,
                          scored=spec.reward is not None)
    for seq in response.sequences:
        tokens = list(seq.tokens)
        text, clean = completion_text(renderer, tokens, stop, mode=reward_fn.text_mode)
        truncated = seq.stop_reason == "length"
        score, traces = reward_fn.trace(text, values, truncated=truncated, num_tokens=len(tokens))
        result.completions.append(Sampled(text, tokens, truncated, score, traces))
    return result
