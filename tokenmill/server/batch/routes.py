"""The /v1/batches routes: a batch of one JSONL file's lines, run in the background
(runner.py) and followed with GET; /v1/files is file_routes.py."""

from __future__ import annotations

import secrets
import time
from typing import Any

from fastapi import APIRouter, Query, Request

from tokenmill.server.batch.lines import ENDPOINTS
from tokenmill.server.batch.protocol import BatchCreateRequest
from tokenmill.server.batch.service import batch_service, page
from tokenmill.server.body import parse_body
from tokenmill.server.errors import APIError, bad_request
from tokenmill.server.state import off_loop

router = APIRouter()
REQUEST_BODIES = {"/v1/batches": BatchCreateRequest}
DAY_S = 86400


@router.post("/v1/batches")
async def create_batch(request: Request):
    service = batch_service(request)
    config = service.config
    req = await parse_body(request, BatchCreateRequest, service.settings.max_body_bytes)
    who = service.owner(request)
    if req.endpoint not in ENDPOINTS:
        raise bad_request(
            f"endpoint: {req.endpoint[:80]!r} is not supported; use one of {', '.join(ENDPOINTS)}",
            param="endpoint",
        )
    record = await service.get_file(req.input_file_id, who, "input_file_id")
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
    service.state.check_accepting()
    batch = _new_batch(req, int(time.time()), record.lines)
    if not await off_loop(service.store.create, who, batch, config.max_active_batches):
        raise APIError(
            429, f"too many unfinished batches (at most {config.max_active_batches})",
            "rate_limit_error", None, "too_many_batches",
        )  # fmt: skip
    service.runner.launch(batch["id"])
    return batch


@router.get("/v1/batches")
async def list_batches(
    request: Request,
    limit: int = Query(20, ge=1, le=100),
    after: str | None = Query(None, max_length=100),
):
    service = batch_service(request)
    found, more = await off_loop(service.store.list, service.owner(request), limit, after)
    return page(found, more)


@router.get("/v1/batches/{batch_id}")
async def retrieve_batch(batch_id: str, request: Request):
    service = batch_service(request)
    return await service.get_batch(batch_id, service.owner(request))


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, request: Request):
    """Idempotent: a batch already cancelling or finished is returned as it is."""
    service = batch_service(request)
    who = service.owner(request)
    await service.get_batch(batch_id, who)
    changes = {"status": "cancelling", "cancelling_at": int(time.time())}
    if await off_loop(service.store.update, batch_id, changes, ("validating", "in_progress")):
        service.runner.cancel(batch_id)
    return await service.get_batch(batch_id, who)


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
