"""``LocalRestClient``: the checkpoint and training-run calls of ``tinker.RestClient`` that sailrl, Sail and
tinker-cookbook use.

Training runs: ``get_training_run`` / ``get_training_run_by_tinker_path`` (``tinker_cookbook.checkpoint_utils``
reads a resumed checkpoint's renderer from the run's ``user_metadata``), ``list_training_runs`` (newest first) and
``list_user_checkpoints`` (every run's checkpoints, newest first), each returning the SDK's own
``tinker.types`` and paginated as the SDK's (``limit``, ``offset``, a ``Cursor``). A run is a training client's
record (``checkpoints.CheckpointStore.write_run``), or for a run saved without one, what its checkpoints say.

``sail.get_tinker_checkpoint_signed_url_async`` calls ``set_checkpoint_ttl_from_tinker_path_async``
and ``get_checkpoint_archive_url_from_tinker_path_async``; the archive URL here is a ``file://``
URL of a tar of the checkpoint directory. (tinker 0.38's ``RestClient`` has no
``get_checkpoint_archive_url_from_tinker_path*`` method, so that pair is not covered by the SDK
drift test.)
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import pathlib
from dataclasses import dataclass
from typing import Literal

from tinker import types
from tinker.lib.public_interfaces.api_future import APIFuture
from tinker.lib.public_interfaces.rest_client import RestClient

from sailrl.runtime.backends.local.weights.checkpoints import CheckpointPathError, CheckpointStore, LocalPath
from sailrl.runtime.backends.local.futures import Worker
from sailrl.runtime.backends.local.sdk import refuse_the_rest
from sailrl.runtime.backends.local.weights.tiny import BaseModelSpec

#: ``TrainingRun.model_owner`` of every local run.
LOCAL_OWNER = "local"


@dataclass(frozen=True)
class CheckpointArchiveUrlResponse:
    """``url``: ``file://`` URL of the checkpoint's tar archive; ``expires``: when the TTL ends (or None)."""

    url: str
    expires: _dt.datetime | None = None


@refuse_the_rest(RestClient)
class LocalRestClient(RestClient):
    """Checkpoint TTL, archive URL, listing and deletion for ``local://`` checkpoints; training runs.
    ``last_requests``: the live runs' last request times (``backend.LocalBackend.last_requests``)."""

    def __init__(self, worker: Worker, store: CheckpointStore,
                 last_requests: dict[str, _dt.datetime] | None = None):
        self._worker = worker
        self._store = store
        self._last_requests = last_requests if last_requests is not None else {}

    def get_telemetry(self) -> None:
        """No telemetry: nothing leaves this machine."""
        return None

    def set_checkpoint_ttl_from_tinker_path(
        self, tinker_path: str, ttl_seconds: int | None
    ) -> APIFuture[None]:
        """Record a TTL for the checkpoint (metadata only; nothing is deleted automatically)."""
        return self._worker.submit(lambda: self._store.set_ttl(tinker_path, ttl_seconds))

    async def set_checkpoint_ttl_from_tinker_path_async(
        self, tinker_path: str, ttl_seconds: int | None
    ) -> None:
        return await self.set_checkpoint_ttl_from_tinker_path(
            tinker_path=tinker_path, ttl_seconds=ttl_seconds
        )

    def _archive(self, tinker_path: str) -> CheckpointArchiveUrlResponse:
        archive = self._store.archive(tinker_path)
        expires = self._store.read_meta(tinker_path).get("expires_at")
        return CheckpointArchiveUrlResponse(
            url=pathlib.Path(archive).as_uri(),
            expires=_dt.datetime.fromisoformat(expires) if expires else None,
        )

    def get_checkpoint_archive_url_from_tinker_path(
        self, tinker_path: str
    ) -> APIFuture[CheckpointArchiveUrlResponse]:
        """Tar the checkpoint directory and return its ``file://`` URL."""
        return self._worker.submit(lambda: self._archive(tinker_path))

    async def get_checkpoint_archive_url_from_tinker_path_async(
        self, tinker_path: str
    ) -> CheckpointArchiveUrlResponse:
        return await self.get_checkpoint_archive_url_from_tinker_path(tinker_path)

    def delete_checkpoint_from_tinker_path(self, tinker_path: str) -> APIFuture[None]:
        """Delete the checkpoint directory (and its archive)."""
        return self._worker.submit(lambda: self._store.delete(tinker_path))

    async def delete_checkpoint_from_tinker_path_async(self, tinker_path: str) -> None:
        return await self.delete_checkpoint_from_tinker_path(tinker_path)

    def list_checkpoints(self, training_run_id: types.ModelID) -> APIFuture[types.CheckpointsListResponse]:
        """The run's checkpoints (oldest first) as ``tinker.types.CheckpointsListResponse``."""
        return self._worker.submit(
            lambda: types.CheckpointsListResponse(checkpoints=self._store.list_run(training_run_id))
        )

    async def list_checkpoints_async(self, training_run_id: types.ModelID) -> types.CheckpointsListResponse:
        return await self.list_checkpoints(training_run_id)

    # ------------------------------------------------------------------ training runs
    def _training_run(self, run_id: str) -> types.TrainingRun:
        record = self._store.read_run(run_id)
        checkpoints = self._store.list_run(run_id)
        if record is None:
            if not checkpoints:
                raise CheckpointPathError(f"No training run {run_id!r} under {self._store.base_dir}.")
            record = _record_from_checkpoint(self._store.existing(checkpoints[0].tinker_path), run_id)
        times = [_dt.datetime.fromisoformat(record["created"])] + [c.time for c in checkpoints]
        if run_id in self._last_requests:
            times.append(self._last_requests[run_id])
        training = [c for c in checkpoints if c.checkpoint_type == "training"]
        sampler = [c for c in checkpoints if c.checkpoint_type == "sampler"]
        return types.TrainingRun(
            training_run_id=run_id,
            base_model=record["base_model"],
            model_owner=LOCAL_OWNER,
            is_lora=True,
            lora_rank=record.get("lora_rank"),
            last_request_time=max(times),
            last_checkpoint=training[-1] if training else None,
            last_sampler_checkpoint=sampler[-1] if sampler else None,
            user_metadata=record.get("user_metadata"),
        )

    def get_training_run(
        self, training_run_id: types.ModelID, access_scope: Literal["owned", "accessible"] = "owned"
    ) -> APIFuture[types.TrainingRun]:
        """The training run ``training_run_id`` (a training client's ``model_id``) as ``tinker.types.TrainingRun``:
        base model, LoRA rank, ``user_metadata`` given when it was created, its last checkpoints. The future fails
        with ``checkpoints.CheckpointPathError`` for a run this base directory does not hold."""
        return self._worker.submit(lambda: self._training_run(training_run_id))

    async def get_training_run_async(
        self, training_run_id: types.ModelID, access_scope: Literal["owned", "accessible"] = "owned"
    ) -> types.TrainingRun:
        return await self.get_training_run(training_run_id, access_scope)

    def get_training_run_by_tinker_path(
        self, tinker_path: str, access_scope: Literal["owned", "accessible"] = "owned"
    ) -> APIFuture[types.TrainingRun]:
        """The training run that saved the checkpoint at ``tinker_path`` (``local://<run>/<kind>/<name>``). Raises
        ``checkpoints.CheckpointPathError`` (a ``ValueError``, as the SDK raises for a malformed path) at once for
        a path that is not one."""
        run_id = LocalPath.parse(tinker_path).run_id
        return self._worker.submit(lambda: self._training_run(run_id))

    async def get_training_run_by_tinker_path_async(
        self, tinker_path: str, access_scope: Literal["owned", "accessible"] = "owned"
    ) -> types.TrainingRun:
        return await self.get_training_run_by_tinker_path(tinker_path, access_scope)

    def _training_runs(self, limit: int, offset: int) -> types.TrainingRunsResponse:
        runs = sorted((self._training_run(r) for r in self._store.run_ids()),
                      key=lambda r: r.last_request_time, reverse=True)
        return types.TrainingRunsResponse(
            training_runs=runs[offset:offset + limit],
            cursor=types.Cursor(offset=offset, limit=limit, total_count=len(runs)),
        )

    def list_training_runs(
        self,
        limit: int = 20,
        offset: int = 0,
        access_scope: Literal["owned", "accessible"] = "owned",
        project_id: str | None = None,
    ) -> APIFuture[types.TrainingRunsResponse]:
        """The training runs under this base directory, most recently used first, ``limit`` from ``offset``
        (``cursor.total_count``: all of them). ``project_id`` is ignored: local runs have no project."""
        return self._worker.submit(lambda: self._training_runs(limit, offset))

    async def list_training_runs_async(
        self,
        limit: int = 20,
        offset: int = 0,
        access_scope: Literal["owned", "accessible"] = "owned",
        project_id: str | None = None,
    ) -> types.TrainingRunsResponse:
        return await self.list_training_runs(limit, offset, access_scope, project_id)

    def _user_checkpoints(self, limit: int, offset: int) -> types.CheckpointsListResponse:
        every = sorted((c for r in self._store.run_ids() for c in self._store.list_run(r)),
                       key=lambda c: c.time, reverse=True)
        return types.CheckpointsListResponse(
            checkpoints=every[offset:offset + limit],
            cursor=types.Cursor(offset=offset, limit=limit, total_count=len(every)),
        )

    def list_user_checkpoints(self, limit: int = 100, offset: int = 0) -> APIFuture[types.CheckpointsListResponse]:
        """Every run's checkpoints under this base directory, newest first, ``limit`` from ``offset``."""
        return self._worker.submit(lambda: self._user_checkpoints(limit, offset))

    async def list_user_checkpoints_async(self, limit: int = 100, offset: int = 0) -> types.CheckpointsListResponse:
        return await self.list_user_checkpoints(limit, offset)


def _record_from_checkpoint(directory: str, run_id: str) -> dict:
    """A run record from one of its checkpoints, for a run saved without ``training_run.json``."""
    with open(os.path.join(directory, "adapter_config.json")) as f:
        rank = int(json.load(f)["r"])
    created = _dt.datetime.fromtimestamp(os.path.getmtime(directory), _dt.UTC).isoformat()
    return {"training_run_id": run_id, "base_model": BaseModelSpec.read(directory).model_name, "lora_rank": rank,
            "user_metadata": None, "created": created}
