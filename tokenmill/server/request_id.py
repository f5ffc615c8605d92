"""Every request's id: the client's X-Request-Id (at most 200 characters) or a new one,
kept in request.state.request_id and echoed in the response's X-Request-Id."""

from __future__ import annotations

import uuid


class RequestIdMiddleware:
    """Pure ASGI (streaming and disconnects pass through untouched): assigns the request id
    and echoes it as X-Request-Id."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        request_id = headers.get(b"x-request-id", b"").decode("latin-1")[:200] or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        rid_header = (b"x-request-id", request_id.encode("latin-1"))

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                existing = [
                    h for h in message.get("headers", []) if h[0].lower() != b"x-request-id"
                ]
                message = {**message, "headers": [*existing, rid_header]}
            await send(message)

        return await self.app(scope, receive, send_with_id)
