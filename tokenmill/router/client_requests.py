"""A client's request at the router: its body (bounded), its JSON, and whether the client
is still there (a request whose client left is cancelled at the replica)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from tokenmill.router.proxy import UpstreamStream
from tokenmill.server.errors import APIError


async def read_body(request: Request, max_bytes: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise APIError(413, f"request body of {length} bytes exceeds the limit of {max_bytes}")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > max_bytes:
            raise APIError(413, f"request body exceeds the limit of {max_bytes} bytes")
    return bytes(body)


async def until_disconnect(request: Request) -> None:
    """Returns when the client goes away (call once its body has been read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_client_leaves(request: Request, work: Awaitable[Response]) -> Response | None:
    """`work`'s reply, or None if the client left first. Then `work` is cancelled: that
    closes its request to the replica, which aborts the generation and frees its blocks,
    and releases the router's booking (a started stream watches for itself)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(until_disconnect(request))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # cancelled: a reply that is ready will never be sent
        if task.done() and not task.cancelled() and task.exception() is None:
            reply = task.result()
            if isinstance(reply, UpstreamStream):
                await reply.cleanup()
        raise
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        return task.result()
    await asyncio.gather(task, return_exceptions=True)  # its cleanup, before the slot goes
    return None


def parse_json(body: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, or None (not JSON, too deep, a huge integer: the replica
    answers with the precise 400)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are too
        return None
    return data if isinstance(data, dict) else None
