"""Shared state of one ``LocalServiceClient``: worker threads, checkpoint store, base models, samplers.

Worker threads (``futures.Worker``): ``worker`` runs the training clients' operations in order
(forward_backward, optim_step, saves, loads, sampler snapshots of the training weights);
``sample_worker`` runs sample batches and builds samplers from checkpoints; ``io_worker`` runs the
rest client's checkpoint calls (TTL, archive URL for Sail, listing, deletion), so signing a
checkpoint does not wait for a step to train.

A sampler always decodes with its own merged copy of the weights (``merged_model``) -- from the
adapter file a save wrote, or from a copy of the adapter tensors taken in order on the training
worker -- so a step can train while the previous weights sample, and what a sampler returns does
not depend on what trains meanwhile. The training and sampling workers share ``worker_threads()``
torch intra-op threads: all of them for a job running alone, half each while both run.

With ``processes=True`` the training clients' trainers live in a child process (``trainer_process``) and the
samplers over checkpoints and base models decode in another (``sampler_process``), so training, sampling and the
loop's own Python do not share one interpreter's GIL (``child``); ``worker`` and ``sample_worker`` then only queue
work and wait for the children. Samplers over in-memory snapshots (``save_weights_and_get_sampling_client``)
still decode in this process.
"""

from __future__ import annotations

import datetime
import os
import threading
from collections import OrderedDict
from typing import Any

import torch

from sailrl.runtime.backends.local.weights.checkpoints import CheckpointStore, require_kind
from sailrl.runtime.backends.local.futures import ThreadBudget, Worker
from sailrl.runtime.backends.local.engine.lora import merge_adapter
from sailrl.runtime.backends.local.engine.merged import load_merged, max_context_of, prepare_for_sampling
from sailrl.runtime.backends.local.processes.sampler_process import SamplerProcess, Source, base_source, checkpoint_source
from sailrl.runtime.backends.local.sampling import InProcessEngine, LocalSamplingClient, ProcessEngine, SampleBatcher
from sailrl.runtime.backends.local.weights.tiny import BaseModelCache, BaseModelSpec
from sailrl.runtime.backends.local.processes.trainer_process import TrainerProcess


def worker_threads() -> int:
    """The torch intra-op threads the workers share: the calling thread's ``torch.get_num_threads()``.

    ``LocalServiceClient`` sets that from its ``num_threads`` (default ``device.thread_count``:
    ``SAILRL_THREADS``, else 1 for the built-in models) just before it builds the backend, so the
    thread policy lives in one place. A job running alone gets all of them; while the training and
    the sampling worker both run jobs, each gets half (at least 1; ``futures.ThreadBudget``).
    """
    return max(1, torch.get_num_threads())


class _LockedBaseModels:
    """``BaseModelCache`` behind a lock: both workers load and copy base models, and a first load of a
    built-in model seeds torch's global RNG (``tiny.build_tiny_model``)."""

    def __init__(self, cache: BaseModelCache, lock: threading.RLock):
        self._cache = cache
        self._lock = lock

    def get(self, spec: BaseModelSpec) -> Any:
        with self._lock:
            return self._cache.get(spec)

    def tokenizer(self, spec: BaseModelSpec) -> Any:
        with self._lock:
            return self._cache.tokenizer(spec)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cache, name)


class LocalBackend:
    """Everything the local clients share: ``worker`` (training), ``sample_worker`` (sampling),
    ``io_worker`` (rest calls), the checkpoint store, the base models and a small cache of samplers
    per checkpoint path.

    ``model_lock`` guards base-model loading and anything else that seeds torch's global RNG
    (a LoRA init) against the other worker. ``processes``: train and sample in child processes (see the module
    docstring); the sampling one gets half of ``worker_threads()`` torch threads (at least 1), the training one the
    rest (at least 1).
    """

    def __init__(
        self,
        base_dir: str,
        device: str,
        dtype: torch.dtype,
        seed: int,
        coalesce_window_s: float = 0.003,
        sampler_cache_size: int = 2,
        processes: bool = False,
    ):
        total = worker_threads()
        self.sampler_process: SamplerProcess | None = None
        self.trainer_process: TrainerProcess | None = None
        if processes:
            sample_threads = max(1, total // 2)
            self.sampler_process = SamplerProcess(dtype=dtype, device=device, seed=seed, threads=sample_threads)
            self.trainer_process = TrainerProcess(dtype=dtype, device=device, base_dir=os.path.abspath(base_dir),
                                                  threads=max(1, total - sample_threads))
        self.threads = ThreadBudget(total)
        # with the child processes these threads only wait for them: they take no torch threads
        self.worker = Worker("sailrl-local-train", None if processes else self.threads)
        self.sample_worker = Worker("sailrl-local-sample", None if processes else self.threads)
        self.io_worker = Worker("sailrl-local-io")  # checkpoint TTLs, archives, listings: no model work
        self.model_lock = threading.RLock()
        self.store = CheckpointStore(base_dir)
        self.bases = _LockedBaseModels(BaseModelCache(dtype, device), self.model_lock)
        self.device = device
        self.dtype = dtype
        self.seed = seed
        self.sample_generator = torch.Generator().manual_seed(seed)
        self.coalesce_window_s = coalesce_window_s
        self._samplers: OrderedDict[str, LocalSamplingClient] = OrderedDict()
        self._samplers_lock = threading.Lock()
        self._sampler_cache_size = sampler_cache_size
        self._clients_made = 0
        #: when each training run of this service last made a request (``LocalRestClient.get_training_run``)
        self.last_requests: dict[str, datetime.datetime] = {}

    def close(self) -> None:
        """Stop the worker threads once their queued work is done."""
        for process in (self.sampler_process, self.trainer_process):  # first: the workers may be waiting for them
            if process is not None:
                process.close()
        self.worker.close()
        self.sample_worker.close()
        self.io_worker.close()

    def next_lora_seed(self) -> int:
        """Seed for a LoRA init when the caller gives none: derived from the backend seed."""
        self._clients_made += 1
        return self.seed * 1_000_003 + self._clients_made

    def sampling_client(self, model: Any, spec: BaseModelSpec, model_path: str | None) -> LocalSamplingClient:
        """A sampling client over ``model`` (a copy owned by the sampler: merged, eval mode, frozen);
        its batches run on ``sample_worker``."""
        prepare_for_sampling(model)
        engine = InProcessEngine(model, self.bases.tokenizer(spec), max_context_of(model), self.sample_generator)
        batcher = SampleBatcher(self.sample_worker, engine, coalesce_window_s=self.coalesce_window_s)
        return LocalSamplingClient(batcher, self.bases.tokenizer(spec), spec.model_name, model_path)

    def process_sampling_client(self, source: Source, spec: BaseModelSpec, model_path: str | None
                                ) -> LocalSamplingClient:
        """A sampling client whose batches decode in the sampling process over ``source`` (loaded there now, so
        a bad checkpoint fails here). Runs on ``sample_worker``."""
        assert self.sampler_process is not None
        self.sampler_process.load(source)
        batcher = SampleBatcher(self.sample_worker, ProcessEngine(self.sampler_process, source),
                                coalesce_window_s=self.coalesce_window_s)
        return LocalSamplingClient(batcher, self.bases.tokenizer(spec), spec.model_name, model_path)

    def base_sampling_client(self, spec: BaseModelSpec) -> LocalSamplingClient:
        """A sampler over the base model alone (no adapter): in the sampling process when there is one."""
        if self.sampler_process is not None:
            return self.process_sampling_client(base_source(spec), spec, None)
        return self.sampling_client(self.bases.get(spec), spec, None)

    def merged_model(self, spec: BaseModelSpec, state: dict[str, torch.Tensor], adapter_config: dict) -> Any:
        """A fresh copy of the base with the adapter merged into its weights (fast decode)."""
        return merge_adapter(self.bases.get(spec), state, adapter_config)

    def sampling_client_from_path(self, model_path: str) -> LocalSamplingClient:
        """Load ``local://...`` (or an adapter directory) and return a sampler; cached per path.

        The adapter is read from the files the save wrote and merged into a fresh copy of the base,
        so later training never changes what this sampler decodes with. Raises
        ``CheckpointPathError`` for a bad or missing path, or a ``weights/`` one (a sampler reads sampler weights,
        as on Tinker; a directory is taken as it is). Runs on ``sample_worker``.
        """
        if not os.path.isdir(model_path):
            require_kind(model_path, "sampler_weights", "A sampling client")
        with self._samplers_lock:
            if model_path in self._samplers:
                self._samplers.move_to_end(model_path)
                return self._samplers[model_path]
        directory = model_path if os.path.isdir(model_path) else self.store.existing(model_path)
        if self.sampler_process is not None:
            client = self.process_sampling_client(checkpoint_source(directory), BaseModelSpec.read(directory),
                                                  model_path)
        else:
            spec, model = load_merged(self.bases, directory)
            client = self.sampling_client(model, spec, model_path)
        with self._samplers_lock:
            self._samplers[model_path] = client
            while len(self._samplers) > self._sampler_cache_size:
                self._samplers.popitem(last=False)
        return client
