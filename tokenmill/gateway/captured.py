"""A response the inner app sends, held whole so the gateway can read or rewrite it before
the client sees it, and a whole response sent on."""

from __future__ import annotations

from typing import Any


class CapturedResponse:
    """The ASGI `send` to hand the inner app; status, headers and body once it returns."""

    def __init__(self) -> None:
        self.status = 500  # the app sent nothing
        self.headers: list[tuple[bytes, bytes]] = []
        self._chunks: list[bytes] = []

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status, self.headers = message["status"], list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            self._chunks.append(message.get("body", b""))

    @property
    def body(self) -> bytes:
        return b"".join(self._chunks)


async def send_whole(send, status: int, headers: list, body: bytes) -> None:
    """`body` as one response, its content-length set (the one in `headers` replaced)."""
    head = [(k, v) for k, v in headers if k.lower() != b"content-length"]
    head.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body, "more_body": False})
