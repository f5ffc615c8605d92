"""Every failure in the OpenAI error envelope: APIError as raised, validation errors as
400s naming the field, unknown paths and methods, a client that left (499, unread) and
anything unexpected (500 with the request id, logged)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from tokenmill.server.errors import APIError, error_body
from tokenmill.server.json_body import validation_error
from tokenmill.server.state import ClientDisconnected

logger = logging.getLogger("tokenmill.server.api")


async def api_error(_request: Request, exc: APIError):
    return exc.response()


async def request_validation_error(_request: Request, exc: RequestValidationError):
    return validation_error(exc).response()


async def http_error(_request: Request, exc: StarletteHTTPException):
    kind = {404: "not_found_error", 405: "invalid_request_error"}.get(
        exc.status_code, "invalid_request_error"
    )
    message = {404: "no such endpoint", 405: "method not allowed"}.get(
        exc.status_code, str(exc.detail)
    )
    return JSONResponse(
        error_body(message, kind),
        status_code=exc.status_code,
        headers=getattr(exc, "headers", None),
    )


async def client_disconnected(request: Request, _exc: Exception):
    # nobody reads it: nginx's "client closed request"
    logger.debug("request %s: the client left", getattr(request.state, "request_id", "?"))
    return Response(status_code=499)


async def internal_error(request: Request, exc: Exception):
    rid = getattr(request.state, "request_id", "?")
    logger.exception("internal error in request %s", rid)
    return JSONResponse(
        error_body(f"internal server error (request id {rid})", "internal_server_error"),
        status_code=500,
    )


def add_exception_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(RequestValidationError, request_validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(ClientDisconnected, client_disconnected)
    app.add_exception_handler(ClientDisconnect, client_disconnected)  # left mid-body
    app.add_exception_handler(Exception, internal_error)
