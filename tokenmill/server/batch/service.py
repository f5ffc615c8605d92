"""What the /v1/files and /v1/batches routes share: the stores, the runner and the lookups
that 404 an id the caller does not own. build_app puts one BatchService (open_service) in
app.state.batch when batches are on, and runs `lifespan` around the app's."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from tokenmill.server.batch.config import BatchConfig
from tokenmill.server.batch.files import FILE_ID, FileRecord, FileStore
from tokenmill.server.batch.runner import BatchRunner
from tokenmill.server.batch.store import BATCH_ID, BatchStore
from tokenmill.server.database import Database
from tokenmill.server.errors import APIError
from tokenmill.server.responses.owner import request_owner
from tokenmill.server.settings import ServerSettings
from tokenmill.server.state import ServerState, off_loop

_FILE_ID, _BATCH_ID = re.compile(FILE_ID), re.compile(BATCH_ID)


def missing(kind: str, object_id: str, param: str) -> APIError:
    return APIError(
        404, f"No such {kind}: {object_id[:80]!r}", "invalid_request_error", param, "not_found"
    )


@dataclass
class BatchService:
    state: ServerState
    config: BatchConfig
    db: Database
    files: FileStore
    store: BatchStore
    runner: BatchRunner

    @property
    def settings(self) -> ServerSettings:
        return self.state.settings

    def owner(self, request: Request) -> str:
        return request_owner(request, self.settings.api_key)

    async def get_file(self, file_id: str, who: str, param: str = "file_id") -> FileRecord:
        found = _FILE_ID.match(file_id)
        record = await off_loop(self.files.get, file_id, who) if found else None
        if record is None:
            raise missing("File object", file_id, param)
        return record

    async def get_batch(self, batch_id: str, who: str) -> dict[str, Any]:
        found = _BATCH_ID.match(batch_id)
        batch = await off_loop(self.store.get, batch_id, who) if found else None
        if batch is None:
            raise missing("batch", batch_id, "batch_id")
        return batch


def open_service(state: ServerState) -> BatchService | None:
    """The service (its database opened), or None when batches are off."""
    config: BatchConfig = state.settings.batch
    if not config.enabled:
        return None
    db = Database(config.database_path())
    files = FileStore(db, config.files_path(), config.max_total_bytes)
    store = BatchStore(db)
    runner = BatchRunner(state, store, files, config)
    return BatchService(state, config, db, files, store, runner)


def batch_service(request: Request) -> BatchService:
    return request.app.state.batch


@asynccontextmanager
async def lifespan(service: BatchService) -> AsyncIterator[None]:
    await service.runner.start()
    try:
        yield
    finally:  # before the engine stops: running lines stop, resumed next start
        await service.runner.close()
        service.db.close()


def page(data: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    """OpenAI's list object of one page."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": more,
    }
