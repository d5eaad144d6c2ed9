"""``LocalRestClient``: the checkpoint calls of ``tinker.RestClient`` that sailrl and Sail use.

``sail.get_tinker_checkpoint_signed_url_async`` calls ``set_checkpoint_ttl_from_tinker_path_async``
and ``get_checkpoint_archive_url_from_tinker_path_async``; the archive URL here is a ``file://``
URL of a tar of the checkpoint directory. (tinker 0.38's ``RestClient`` has no
``get_checkpoint_archive_url_from_tinker_path*`` method, so that pair is not covered by the SDK
drift test.)
"""

from __future__ import annotations

import datetime as _dt
import pathlib
from dataclasses import dataclass

from tinker import types
from tinker.lib.public_interfaces.api_future import APIFuture

from sailrl.runtime.local.futures import Worker


@dataclass(frozen=True)
class CheckpointArchiveUrlResponse:
    """``url``: ``file://`` URL of the checkpoint's tar archive; ``expires``: when the TTL ends (or None)."""

    url: str
    expires: _dt.datetime | None = None


class LocalRestClient:
    """Checkpoint TTL, archive URL, listing and deletion for ``local://`` checkpoints."""

    def __init__(self, worker: Worker, store):
        self._worker = worker
        self._store = store

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
