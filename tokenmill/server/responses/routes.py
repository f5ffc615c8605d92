"""The /v1/responses routes. build_app puts the ResponsesService (open_service) in
app.state.responses and runs `lifespan` around the app's."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Literal

from fastapi import APIRouter, Query, Request

from tokenmill.openai.responses_protocol import ITEM_ID, RESPONSE_ID, ResponsesRequest
from tokenmill.server.body import parse_body
from tokenmill.server.database import Database
from tokenmill.server.errors import bad_request
from tokenmill.server.responses.owner import request_owner
from tokenmill.server.responses.serving import ResponsesService
from tokenmill.server.responses.store import ResponseStore
from tokenmill.server.state import ServerState

router = APIRouter()
REQUEST_BODIES = {"/v1/responses": ResponsesRequest}
_RESPONSE_ID = re.compile(RESPONSE_ID)


def open_service(state: ServerState) -> ResponsesService:
    """The service, with its store when --response-store is on."""
    config = state.settings.response_store
    store = ResponseStore(Database(config.database_path()), config) if config.enabled else None
    return ResponsesService(state, store)


@asynccontextmanager
async def lifespan(service: ResponsesService) -> AsyncIterator[None]:
    try:
        yield
    finally:  # before the engine stops: background responses end, the file closes
        await service.close()
        if service.store is not None:
            service.store.db.close()


def _service(request: Request) -> ResponsesService:
    return request.app.state.responses


def _owner(request: Request) -> str:
    return request_owner(request, _service(request).state.settings.api_key)


def _checked(response_id: str) -> str:
    if not _RESPONSE_ID.match(response_id):
        raise bad_request(
            f"response_id: {response_id[:80]!r} is not a response id (resp_...)", "response_id"
        )
    return response_id


@router.post("/v1/responses")
async def create_response(request: Request):
    service = _service(request)
    req = await parse_body(request, ResponsesRequest, service.state.settings.max_body_bytes)
    return await service.create(req, request, _owner(request), request.state.request_id)


@router.get("/v1/responses/{response_id}")
async def retrieve_response(response_id: str, request: Request):
    return await _service(request).retrieve(_checked(response_id), _owner(request))


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request):
    return await _service(request).delete(_checked(response_id), _owner(request))


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(response_id: str, request: Request):
    return await _service(request).cancel(_checked(response_id), _owner(request))


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(
    response_id: str,
    request: Request,
    limit: int = Query(20, ge=1, le=100),
    order: Literal["asc", "desc"] = "desc",
    after: str | None = Query(None, pattern=ITEM_ID),
):
    return await _service(request).input_items(
        _checked(response_id), _owner(request), limit, order, after
    )
