"""The /v1/responses routes, added to the app by one call from build_app."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Literal

from fastapi import FastAPI, Query, Request

from tokenmill.server.body import parse_body
from tokenmill.server.database import Database
from tokenmill.server.errors import bad_request
from tokenmill.server.responses.owner import request_owner
from tokenmill.server.responses.protocol import ITEM_ID, RESPONSE_ID, ResponsesRequest
from tokenmill.server.responses.serving import ResponsesService
from tokenmill.server.responses.store import ResponseStore
from tokenmill.server.state import ServerState

REQUEST_BODIES = {"/v1/responses": ResponsesRequest}
_RESPONSE_ID = re.compile(RESPONSE_ID)


def _checked(response_id: str) -> str:
    if not _RESPONSE_ID.match(response_id):
        raise bad_request(
            f"response_id: {response_id[:80]!r} is not a response id (resp_...)", "response_id"
        )
    return response_id


def add_response_routes(app: FastAPI, state: ServerState) -> ResponsesService:
    config = state.settings.response_store
    store = ResponseStore(Database(config.database_path()), config) if config.enabled else None
    service = ResponsesService(state, store)
    settings = state.settings

    def owner(request: Request) -> str:
        return request_owner(request, settings.api_key)

    @app.post("/v1/responses")
    async def create_response(request: Request):
        req = await parse_body(request, ResponsesRequest, settings.max_body_bytes)
        return await service.create(req, request, owner(request), request.state.request_id)

    @app.get("/v1/responses/{response_id}")
    async def retrieve_response(response_id: str, request: Request):
        return await service.retrieve(_checked(response_id), owner(request))

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str, request: Request):
        return await service.delete(_checked(response_id), owner(request))

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(response_id: str, request: Request):
        return await service.cancel(_checked(response_id), owner(request))

    @app.get("/v1/responses/{response_id}/input_items")
    async def list_input_items(
        response_id: str,
        request: Request,
        limit: int = Query(20, ge=1, le=100),
        order: Literal["asc", "desc"] = "desc",
        after: str | None = Query(None, pattern=ITEM_ID),
    ):
        return await service.input_items(_checked(response_id), owner(request), limit, order, after)

    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app_: FastAPI) -> AsyncIterator[None]:
        async with inner(app_) as value:
            try:
                yield value
            finally:  # before the engine stops: background responses end, the file closes
                await service.close()
                if store is not None:
                    store.db.close()

    app.router.lifespan_context = lifespan
    return service
