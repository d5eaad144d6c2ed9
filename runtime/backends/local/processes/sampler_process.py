"""The embedded backend's sampling process: samplers that decode in a child process (``child.ChildProcess``).

Why a process: see ``child``. What runs where: the child holds merged copies of the models it samples (a
checkpoint directory's adapter merged into its base, or a base model alone), keyed by their source, the last
``MAX_MODELS`` of them (one dropped earlier is loaded again from its source when asked for); it serves one batch at
a time, in the order the parent sends them, so the draws of its ``torch.Generator`` (seeded with the backend seed,
used by requests without ``SamplingParams.seed``) come in the same order as in-process sampling's. The parent's
``SampleBatcher`` still coalesces concurrent ``sample`` calls into one batch; the batch job on the parent's
sampling worker thread sends it here and waits. The samples equal in-process sampling's for the same checkpoint,
requests and seeds (``tests/backends/test_local_processes.py``).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from typing import Any

import torch

from sailrl.runtime.backends.local.processes.child import ChildProcess, LocalProcessError
from sailrl.runtime.backends.local.engine.generation import generate
from sailrl.runtime.backends.local.engine.merged import load_merged, max_context_of, prepare_for_sampling
from sailrl.runtime.backends.local.weights.tiny import BaseModelCache, BaseModelSpec

MAX_MODELS = 3  # merged models the child keeps: the policy sampling now, the next one, and a KL reference

# A source: what the child decodes with. ("checkpoint", directory) or ("base", BaseModelSpec as JSON).
Source = tuple[str, str]


class SamplerProcessError(LocalProcessError):
    """The sampling process stopped or could not start; the message says why in one line."""

    code = "E152"


def checkpoint_source(directory: str) -> Source:
    """The source of a sampler over a checkpoint directory (adapter files written by a save)."""
    return ("checkpoint", os.path.abspath(directory))


def base_source(spec: BaseModelSpec) -> Source:
    """The source of a sampler over a base model alone (``tiny.BaseModelSpec``)."""
    return ("base", json.dumps(spec.to_json(), sort_keys=True))


class SamplerProcess(ChildProcess):
    """A child process that decodes for the parent's samplers. ``dtype`` / ``device``: the backend's; ``seed``:
    its ``torch.Generator``'s; ``threads``: its ``torch.set_num_threads``."""

    HOST = "sailrl.runtime.backends.local.processes.sampler_process:SamplerHost"

    def __init__(self, *, dtype: Any, device: str, seed: int, threads: int):
        super().__init__("sampler", {"dtype": str(dtype).removeprefix("torch."), "device": device,
                                     "seed": int(seed), "threads": int(threads)},
                         what="sampling process", error=SamplerProcessError)

    def load(self, source: Source) -> None:
        """Load (and keep) the model of ``source`` in the child; its load errors are raised here."""
        self.call("load", source, "loading a sampler checkpoint")

    def generate(self, source: Source, requests: list[Any]) -> list[Any]:
        """``generation.generate`` in the child over ``source``'s model: one ``SampleResponse`` per request."""
        return self.call("generate", (source, requests), "sampling")


class SamplerHost:
    """The child's side: its models by source (least recently used dropped past ``MAX_MODELS``) and generator."""

    def __init__(self, init: dict[str, Any]):
        self._bases = BaseModelCache(getattr(torch, init["dtype"]), init["device"])
        self._models: OrderedDict[Source, tuple[Any, Any, int]] = OrderedDict()
        self._generator = torch.Generator().manual_seed(init["seed"])

    def _get(self, source: Source) -> tuple[Any, Any, int]:
        if source in self._models:
            self._models.move_to_end(source)
            return self._models[source]

        kind, value = source
        if kind == "checkpoint":
            spec, model = load_merged(self._bases, value)
        else:
            spec = BaseModelSpec.from_json(json.loads(value))
            model = self._bases.get(spec)
        prepare_for_sampling(model)
        entry = (model, self._bases.tokenizer(spec), max_context_of(model))
        self._models[source] = entry
        while len(self._models) > MAX_MODELS:
            self._models.popitem(last=False)
        return entry

    def handle(self, op: str, payload: Any) -> Any:
        if op == "load":
            self._get(payload)
            return None
        if op == "generate":
            source, requests = payload
            model, tokenizer, max_context = self._get(source)
            return generate(model, requests, tokenizer=tokenizer, max_context=max_context, generator=self._generator)
        raise ValueError(f"the sampling process has no request {op!r}")
