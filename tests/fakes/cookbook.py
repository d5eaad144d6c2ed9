"""What tinker-cookbook's own recipes need to run on the embedded backend, unchanged: ``tinker.ServiceClient`` replaced
by ``LocalServiceClient`` (one checkpoint folder, so a second run resumes from the first's checkpoints), the byte
tokenizer registered under the model's name with ``tinker_cookbook.tokenizer_utils``, the ``role_colon`` renderer
recommended for it, local rows in place of ``datasets.load_dataset``, and a small RL dataset for ``rl/train.py``.

``stop_at``: a run is stopped (:class:`Stopped`) when its training client makes its ``stop_at``-th call of a given
method, as a kill at that point would stop it; the next run resumes from what it saved."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import chz
import datasets
import tinker
from tinker_cookbook import model_info, renderers, tokenizer_utils
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder, StepResult

from sailrl.runtime.backends.local import LocalServiceClient
from sailrl.runtime.backends.local.weights.sources import byte_tokenizer

MODEL = "sailrl/tiny"
RENDERER = "role_colon"

#: GSM8K-shaped rows (``recipes/rl_loop.py`` reads ``question`` and the ``#### N`` answer)
GSM8K = [{"question": f"What is {a} + {b}?", "answer": f"{a} plus {b}.\n#### {a + b}"}
         for a, b in [(1, 2), (3, 4), (2, 2), (5, 1), (6, 3), (4, 4), (7, 2), (8, 1)]]
#: no_robots-shaped rows (``recipes/sl_loop.py`` reads ``messages``)
NO_ROBOTS = [{"messages": [{"role": "user", "content": f"{a}+{b}="}, {"role": "assistant", "content": f"{a + b}"}]}
             for a, b in [(1, 2), (3, 4), (2, 2), (5, 1), (6, 3), (4, 4), (7, 2), (8, 1)]]


class Stopped(Exception):
    """The run was stopped where a kill would have stopped it."""


def load_dataset(path: str, *args: Any, **kwargs: Any) -> datasets.DatasetDict:
    rows = {"openai/gsm8k": GSM8K, "HuggingFaceH4/no_robots": NO_ROBOTS}[path]
    return datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)})


def _attributes(real):
    def get_model_attributes(model_name: str) -> model_info.ModelAttributes:
        if model_name == MODEL:
            return model_info.ModelAttributes(organization="sailrl", version_str="tiny", size_str="0.2M",
                                              is_chat=False, recommended_renderers=(RENDERER,))
        return real(model_name)

    return get_model_attributes


def install(monkeypatch: Any, base_dir: str, services: list, created: list,
            stop_at: tuple[str, int] | None = None) -> None:
    """Point the cookbook at the embedded backend (``base_dir``: its checkpoints); each service made is appended to
    ``services`` and each training client's creation to ``created`` (method name, its first argument);
    ``stop_at=(method, n)`` stops the run at its training client's ``n``-th call of ``method``."""
    tokenizer_utils.register_tokenizer(MODEL, byte_tokenizer)
    monkeypatch.setattr(model_info, "get_model_attributes", _attributes(model_info.get_model_attributes))
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)

    def service_client(*args: Any, **kwargs: Any) -> LocalServiceClient:
        service = LocalServiceClient(MODEL, *args, base_dir=base_dir, seed=0, **kwargs)
        services.append(service)
        _watch_training_clients(service, created, stop_at)
        return service

    monkeypatch.setattr(tinker, "ServiceClient", service_client)


def _watch_training_clients(service: LocalServiceClient, created: list, stop_at: tuple[str, int] | None) -> None:
    calls = [0]

    def stopping(client: Any) -> Any:
        if stop_at is None:
            return client
        method, n = stop_at
        real = getattr(client, method)

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] >= n:
                raise Stopped(f"stopped at call {calls[0]} of {method}")
            return real(*args, **kwargs)

        setattr(client, method, counted)
        return client

    for name in ("create_lora_training_client", "create_training_client_from_state_with_optimizer",
                 "create_lora_training_client_async", "create_training_client_from_state_with_optimizer_async"):
        real_create = getattr(service, name)
        if name.endswith("_async"):
            async def create(*a: Any, _real: Any = real_create, _name: str = name, **k: Any) -> Any:
                created.append((_name, a[0] if a else k.get("base_model") or k.get("path")))
                return stopping(await _real(*a, **k))
        else:
            def create(*a: Any, _real: Any = real_create, _name: str = name, **k: Any) -> Any:
                created.append((_name, a[0] if a else k.get("base_model") or k.get("path")))
                return stopping(_real(*a, **k))
        setattr(service, name, create)


def uninstall() -> None:
    tokenizer_utils.unregister_tokenizer(MODEL)


class DigitsEnv(Env):
    """One turn: "a+b="; reward: the fraction of the reply's characters that are digits (it varies between random
    samples, so groups have a gradient)."""

    def __init__(self, a: int, b: int, renderer: Any):
        self.a, self.b, self.renderer = a, b, renderer

    async def initial_observation(self):
        prompt = self.renderer.build_generation_prompt([{"role": "user", "content": f"{self.a}+{self.b}="}])
        return prompt, self.renderer.get_stop_sequences()

    async def step(self, action, *, extra=None):
        message, _ = self.renderer.parse_response(action)
        text = renderers.get_text_content(message)
        return StepResult(reward=sum(c.isdigit() for c in text) / max(len(text), 1), episode_done=True,
                          next_observation=tinker.ModelInput.from_ints([]), next_stop_condition=[])


class DigitsGroup(EnvGroupBuilder):
    def __init__(self, a: int, b: int, group_size: int):
        self.a, self.b, self.group_size = a, b, group_size

    async def make_envs(self):
        renderer = renderers.get_renderer(RENDERER, tokenizer_utils.get_tokenizer(MODEL))
        return [DigitsEnv(self.a, self.b, renderer) for _ in range(self.group_size)]

    def logging_tags(self):
        return ["digits"]


class DigitsDataset(RLDataset):
    def __init__(self, batch_size: int, group_size: int, batches: int):
        self.batch_size, self.group_size, self.batches = batch_size, group_size, batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return [DigitsGroup(index, i, self.group_size) for i in range(self.batch_size)]

    def __len__(self) -> int:
        return self.batches


@chz.chz
class DigitsDatasetBuilder(RLDatasetBuilder):
    batch_size: int = 2
    group_size: int = 4
    batches: int = 6

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        return DigitsDataset(self.batch_size, self.group_size, self.batches), None
