"""/v1/models through the gateway for a key limited to some models: the list shows only
those, and another model's page is a 404, as for a model the server does not have."""

from __future__ import annotations

from typing import Any

from tokenmill.gateway.jsonio import dumps, loads
from tokenmill.openai.errors import INVALID_REQUEST, error_body

MODELS_PATH = "/v1/models"


async def models_for_key(app, scope, receive, send, allowed: tuple[str, ...] | list[str]) -> None:
    """GET /v1/models or /v1/models/{id} answered by `app`, limited to `allowed`."""
    model_id = scope["path"].removeprefix(MODELS_PATH + "/")
    if scope["path"] != MODELS_PATH and model_id not in allowed:
        message = f"The model {model_id[:200]!r} does not exist"
        body = error_body(message, INVALID_REQUEST, "model", "model_not_found")
        return await _answer(send, 404, [], dumps(body))
    start: dict[str, Any] = {}
    chunks: list[bytes] = []

    async def capture(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, capture)
    out = b"".join(chunks)
    if scope["path"] == MODELS_PATH and start.get("status") == 200:
        listing = loads(out)
        listing["data"] = [m for m in listing.get("data", []) if m.get("id") in allowed]
        out = dumps(listing)
    await _answer(send, start.get("status", 500), start.get("headers", []), out)


async def _answer(send, status: int, headers: list, body: bytes) -> None:
    head = [(k, v) for k, v in headers if k.lower() != b"content-length"]
    if not any(k.lower() == b"content-type" for k, _ in head):
        head.append((b"content-type", b"application/json"))
    head.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body, "more_body": False})
