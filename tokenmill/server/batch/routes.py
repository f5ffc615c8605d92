"""The /v1/files and /v1/batches routes, added to the app by one call from build_app."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.responses import FileResponse

from tokenmill.server.batch.config import BatchConfig
from tokenmill.server.batch.files import FILE_ID, FileStore, new_file_id
from tokenmill.server.batch.lines import ENDPOINTS, validate_file
from tokenmill.server.batch.protocol import BatchCreateRequest
from tokenmill.server.batch.runner import BatchRunner
from tokenmill.server.batch.store import BATCH_ID, BatchStore
from tokenmill.server.batch.upload import receive_upload
from tokenmill.server.body import parse_body
from tokenmill.server.database import Database
from tokenmill.server.errors import APIError, bad_request
from tokenmill.server.responses.owner import request_owner
from tokenmill.server.state import ServerState, off_loop

REQUEST_BODIES = {"/v1/batches": BatchCreateRequest}
_FILE_ID, _BATCH_ID = re.compile(FILE_ID), re.compile(BATCH_ID)
DAY_S = 86400


def _missing(kind: str, object_id: str, param: str) -> APIError:
    return APIError(
        404, f"No such {kind}: {object_id[:80]!r}", "invalid_request_error", param, "not_found"
    )


def add_batch_routes(app: FastAPI, state: ServerState) -> BatchRunner | None:
    config: BatchConfig = state.settings.batch
    if not config.enabled:
        return None
    db = Database(config.database_path())
    files = FileStore(db, config.files_path(), config.max_total_bytes)
    store = BatchStore(db)
    runner = BatchRunner(state, store, files, config)
    settings = state.settings

    def owner(request: Request) -> str:
        return request_owner(request, settings.api_key)

    async def get_file(file_id: str, who: str, param: str = "file_id"):
        record = await off_loop(files.get, file_id, who) if _FILE_ID.match(file_id) else None
        if record is None:
            raise _missing("File object", file_id, param)
        return record

    async def get_batch(batch_id: str, who: str) -> dict[str, Any]:
        batch = await off_loop(store.get, batch_id, who) if _BATCH_ID.match(batch_id) else None
        if batch is None:
            raise _missing("batch", batch_id, "batch_id")
        return batch

    # ------------------------------------------------------------ files

    @app.post("/v1/files")
    async def create_file(request: Request):
        file_id = new_file_id()
        path = files.new_path(file_id)
        upload = await receive_upload(request, path, config.max_file_bytes)
        try:
            if upload.purpose != "batch":
                raise bad_request(
                    f"purpose: {str(upload.purpose)[:40]!r} is not supported; this server "
                    "stores files for the Batch API only (purpose 'batch')",
                    param="purpose",
                )
            summary = await off_loop(validate_file, path, settings.max_body_bytes, config.max_lines)
            record = await off_loop(
                files.create, owner(request), path, "batch", upload.filename or "upload.jsonl",
                summary.lines, summary.urls,
            )  # fmt: skip
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return record.to_dict()

    @app.get("/v1/files")
    async def list_files(
        request: Request,
        purpose: str | None = None,
        limit: int = Query(10_000, ge=1, le=10_000),
        order: Literal["asc", "desc"] = "desc",
        after: str | None = Query(None, max_length=100),
    ):
        page, more = await off_loop(files.list, owner(request), purpose, limit, after, order)
        data = [r.to_dict() for r in page]
        return _page(data, more)

    @app.get("/v1/files/{file_id}")
    async def retrieve_file(file_id: str, request: Request):
        return (await get_file(file_id, owner(request))).to_dict()

    @app.get("/v1/files/{file_id}/content")
    async def file_content(file_id: str, request: Request):
        record = await get_file(file_id, owner(request))
        if not Path(record.path).is_file():
            raise _missing("File object", file_id, "file_id")
        return FileResponse(record.path, media_type="application/jsonl")

    @app.delete("/v1/files/{file_id}")
    async def delete_file(file_id: str, request: Request):
        who = owner(request)
        await get_file(file_id, who)
        user = await off_loop(store.uses_file, file_id)
        if user is not None:
            raise bad_request(
                f"file_id: the file is the input of batch {user}, which has not finished; "
                "cancel it first",
                param="file_id",
            )
        if await off_loop(files.delete, file_id, who) is None:
            raise _missing("File object", file_id, "file_id")
        return {"id": file_id, "object": "file", "deleted": True}

    # ------------------------------------------------------------ batches

    @app.post("/v1/batches")
    async def create_batch(request: Request):
        req = await parse_body(request, BatchCreateRequest, settings.max_body_bytes)
        who = owner(request)
        if req.endpoint not in ENDPOINTS:
            raise bad_request(
                f"endpoint: {req.endpoint[:80]!r} is not supported; use one of "
                f"{', '.join(ENDPOINTS)}",
                param="endpoint",
            )
        record = await get_file(req.input_file_id, who, "input_file_id")
        if record.purpose != "batch":
            raise bad_request(
                f"input_file_id: the file's purpose is {record.purpose!r}, not 'batch'",
                param="input_file_id",
            )
        other = [u for u in record.urls if u != req.endpoint]
        if other:
            raise bad_request(
                f"input_file_id: the file's lines call {other[0]}, not the batch's endpoint "
                f"{req.endpoint}",
                param="input_file_id",
            )
        state.check_accepting()
        now = int(time.time())
        batch = _new_batch(req, now, record.lines)
        if not await off_loop(store.create, who, batch, config.max_active_batches):
            raise APIError(
                429, f"too many unfinished batches (at most {config.max_active_batches})",
                "rate_limit_error", None, "too_many_batches",
            )  # fmt: skip
        runner.launch(batch["id"])
        return batch

    @app.get("/v1/batches")
    async def list_batches(
        request: Request,
        limit: int = Query(20, ge=1, le=100),
        after: str | None = Query(None, max_length=100),
    ):
        page, more = await off_loop(store.list, owner(request), limit, after)
        return _page(page, more)

    @app.get("/v1/batches/{batch_id}")
    async def retrieve_batch(batch_id: str, request: Request):
        return await get_batch(batch_id, owner(request))

    @app.post("/v1/batches/{batch_id}/cancel")
    async def cancel_batch(batch_id: str, request: Request):
        """Idempotent: a batch already cancelling or finished is returned as it is."""
        who = owner(request)
        await get_batch(batch_id, who)
        changes = {"status": "cancelling", "cancelling_at": int(time.time())}
        if await off_loop(store.update, batch_id, changes, ("validating", "in_progress")):
            runner.cancel(batch_id)
        return await get_batch(batch_id, who)

    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app_: FastAPI) -> AsyncIterator[None]:
        async with inner(app_) as value:
            await runner.start()
            try:
                yield value
            finally:  # before the engine stops: running lines stop, resumed next start
                await runner.close()
                db.close()

    app.router.lifespan_context = lifespan
    return runner


def _page(data: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": more,
    }


def _new_batch(req: BatchCreateRequest, now: int, total: int) -> dict[str, Any]:
    """OpenAI's Batch object, as created (status validating)."""
    return {
        "id": f"batch_{secrets.token_hex(12)}",
        "object": "batch",
        "endpoint": req.endpoint,
        "errors": None,
        "input_file_id": req.input_file_id,
        "completion_window": req.completion_window,
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": now,
        "in_progress_at": None,
        "expires_at": now + DAY_S,
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": None,
        "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": {"total": total, "completed": 0, "failed": 0},
        "metadata": req.metadata,
        "model": None,
        "usage": None,
    }
