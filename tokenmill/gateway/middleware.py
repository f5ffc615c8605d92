"""The gateway as pure ASGI middleware, the same in front of the server and the router:
open paths pass; /admin and /v1/usage are answered here; every other path needs a live key
(401 otherwise, in the OpenAI envelope); generation requests go through an Exchange. The web
UI's data (/ui/api/...) also takes the admin key, so its dashboard can show the admin API,
and so does a router's cluster control (/cluster...). The gateway's background tasks (key
refresh, config reload) belong to the app's lifespan, which starts and stops them."""

from __future__ import annotations

import json
import re

from tokenmill.gateway.admin import build_admin_app, is_admin
from tokenmill.gateway.endpoints.chat import ChatAdapter, CompletionAdapter
from tokenmill.gateway.endpoints.embeddings import EmbeddingsAdapter
from tokenmill.gateway.endpoints.responses import ResponsesAdapter
from tokenmill.gateway.exchange import Exchange, filtered_read
from tokenmill.gateway.keys import bearer_token
from tokenmill.openai.errors import INVALID_REQUEST, error_body

ADAPTERS = {
    "/v1/chat/completions": ChatAdapter(),
    "/v1/completions": CompletionAdapter(),
    "/v1/responses": ResponsesAdapter(),
    "/v1/embeddings": EmbeddingsAdapter(),
}
_STORED_RESPONSE = re.compile(r"/v1/responses/[^/]+")
_MESSAGES = {
    "missing": "Missing API key: send 'Authorization: Bearer KEY'.",
    "unknown": "Incorrect API key provided.",
    "revoked": "Incorrect API key provided.",  # as for an unknown key: tells nothing more
    "expired": "This API key has expired.",
}


class GatewayMiddleware:
    def __init__(self, app, gateway) -> None:
        self.app = app
        self.gateway = gateway
        gateway.app = app
        self.admin = build_admin_app(gateway)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        gw = self.gateway
        config = gw.config
        path = scope["path"]
        if path in config.open_paths:
            return await self.app(scope, receive, send)
        if path == "/admin" or path.startswith("/admin/"):
            return await self.admin(scope, receive, send)
        header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        state = gw.keys.check(bearer_token(header))
        if state.problem is not None:
            if path == "/v1/usage" and is_admin(gw, header):
                return await self.admin(scope, receive, send)
            admin_too = path.startswith(("/ui/api/", "/cluster/")) or path == "/cluster"
            if admin_too and is_admin(gw, header):  # dashboard data, the router's cluster control
                return await self.app(scope, receive, send)
            gw.metrics.unauthorized.labels(state.problem).inc()
            return await _unauthorized(send, _MESSAGES[state.problem])
        # the app's owner of stored objects (responses, files, batches): this key, by id, so
        # keys never see each other's objects and a rotated key keeps its own
        owner = "gateway-key:" + state.key.id
        scope = {
            **scope,
            "state": {**(scope.get("state") or {}), "gateway_key": state.key, "owner": owner},
        }
        if path == "/v1/usage":
            return await self.admin(scope, receive, send)
        if scope["method"] == "GET" and _STORED_RESPONSE.fullmatch(path):
            return await filtered_read(
                gw, ADAPTERS["/v1/responses"], scope, receive, send, state.key
            )
        adapter = ADAPTERS.get(path)
        if adapter is None or scope["method"] != "POST":
            headers = [(k, v) for k, v in scope["headers"] if k != b"authorization"]
            return await self.app({**scope, "headers": headers}, receive, send)
        await Exchange(gw, adapter, scope, receive, send, state.key).run()


async def _unauthorized(send, message: str) -> None:
    body = json.dumps(error_body(message, INVALID_REQUEST, code="invalid_api_key")).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b"Bearer"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
