"""The /v1/files routes (the Batch API's input and output files)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse

from tokenmill.server.batch.files import new_file_id
from tokenmill.server.batch.lines import validate_file
from tokenmill.server.batch.service import batch_service, missing, page
from tokenmill.server.batch.upload import receive_upload
from tokenmill.server.errors import bad_request
from tokenmill.server.state import off_loop

router = APIRouter()


@router.post("/v1/files")
async def create_file(request: Request):
    service = batch_service(request)
    config, files = service.config, service.files
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
        max_body_bytes = service.settings.max_body_bytes
        summary = await off_loop(validate_file, path, max_body_bytes, config.max_lines)
        record = await off_loop(
            files.create, service.owner(request), path, "batch",
            upload.filename or "upload.jsonl", summary.lines, summary.urls,
        )  # fmt: skip
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return record.to_dict()


@router.get("/v1/files")
async def list_files(
    request: Request,
    purpose: str | None = None,
    limit: int = Query(10_000, ge=1, le=10_000),
    order: Literal["asc", "desc"] = "desc",
    after: str | None = Query(None, max_length=100),
):
    service = batch_service(request)
    who = service.owner(request)
    found, more = await off_loop(service.files.list, who, purpose, limit, after, order)
    return page([r.to_dict() for r in found], more)


@router.get("/v1/files/{file_id}")
async def retrieve_file(file_id: str, request: Request):
    service = batch_service(request)
    return (await service.get_file(file_id, service.owner(request))).to_dict()


@router.get("/v1/files/{file_id}/content")
async def file_content(file_id: str, request: Request):
    service = batch_service(request)
    record = await service.get_file(file_id, service.owner(request))
    if not Path(record.path).is_file():
        raise missing("File object", file_id, "file_id")
    return FileResponse(record.path, media_type="application/jsonl")


@router.delete("/v1/files/{file_id}")
async def delete_file(file_id: str, request: Request):
    service = batch_service(request)
    who = service.owner(request)
    await service.get_file(file_id, who)
    user = await off_loop(service.store.uses_file, file_id)
    if user is not None:
        raise bad_request(
            f"file_id: the file is the input of batch {user}, which has not finished; "
            "cancel it first",
            param="file_id",
        )
    if await off_loop(service.files.delete, file_id, who) is None:
        raise missing("File object", file_id, "file_id")
    return {"id": file_id, "object": "file", "deleted": True}
