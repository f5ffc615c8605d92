"""/v1/models through the gateway for a key limited to some models: the list shows only
those, and another model's page is a 404, as for a model the server does not have."""

from __future__ import annotations

from tokenmill.gateway.captured import CapturedResponse, send_whole
from tokenmill.gateway.exchange import json_response
from tokenmill.gateway.jsonio import dumps, loads
from tokenmill.openai.errors import INVALID_REQUEST, error_body

MODELS_PATH = "/v1/models"


async def models_for_key(app, scope, receive, send, allowed: tuple[str, ...] | list[str]) -> None:
    """GET /v1/models or /v1/models/{id} answered by `app`, limited to `allowed`."""
    if scope["path"] != MODELS_PATH:
        model_id = scope["path"].removeprefix(MODELS_PATH + "/")
        if model_id in allowed:
            return await app(scope, receive, send)
        message = f"The model {model_id[:200]!r} does not exist"
        start, body = json_response(
            404, error_body(message, INVALID_REQUEST, "model", "model_not_found")
        )
        await send(start)
        return await send(body)
    reply = CapturedResponse()
    await app(scope, receive, reply.send)
    out = reply.body
    if reply.status == 200:
        listing = loads(out)
        listing["data"] = [m for m in listing.get("data", []) if m.get("id") in allowed]
        out = dumps(listing)
    await send_whole(send, reply.status, reply.headers, out)
