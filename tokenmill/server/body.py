"""Request bodies: read with a size bound and a content-type check, then parsed as hostile
input (json_body.py) here when small, in the app's parse process when large."""

from __future__ import annotations

import contextlib
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from fastapi import Request
from pydantic import BaseModel

from tokenmill.server.cpu_pool import off_loop
from tokenmill.server.errors import APIError
from tokenmill.server.json_body import parse_model
from tokenmill.server.parse_process import ParseProcess

_OFF_LOOP_BYTES = 64 * 1024  # above: parsed in another process (~1 ms of work or more)


async def read_body(request: Request, max_bytes: int) -> bytes:
    content_type = request.headers.get("content-type", "")
    if "application/json" not in content_type.lower():
        raise APIError(
            415,
            f"Content-Type must be application/json, got {content_type[:100] or 'none'!r}",
            "invalid_request_error",
        )
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise APIError(
            413,
            f"request body of {length} bytes exceeds the limit of {max_bytes}",
            "invalid_request_error",
        )
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > max_bytes:
            raise APIError(
                413, f"request body exceeds the limit of {max_bytes} bytes", "invalid_request_error"
            )
    return bytes(body)


async def parse_body(request: Request, model: type[BaseModel], max_bytes: int) -> Any:
    """The body as `model`: small ones here, large ones in the app's parse process
    (`app.state.parse_process`) or, while it starts or without one, on the CPU pool."""
    body = await read_body(request, max_bytes)
    if len(body) <= _OFF_LOOP_BYTES:
        return parse_model(body, model)
    parser: ParseProcess | None = getattr(request.app.state, "parse_process", None)
    if parser is not None:
        if parser.ready:
            with contextlib.suppress(BrokenProcessPool):  # it died: parsed here, restarted
                return await parser.parse(body, model)
        parser.start()
    return await off_loop(parse_model, body, model)
