"""The gateway as pure ASGI middleware, the same in front of the server and the router:
open paths pass; /admin and /v1/usage are answered here; the API's paths (USER_PATHS) need
a live key (401 otherwise, in the OpenAI envelope) and generation requests go through an
Exchange. Every other path (loading adapters, resetting caches, engine and router state,
cluster control, any path not listed) takes the admin key: a user key gets 403. The web
UI's data (/ui/api/...) takes either. The gateway's background tasks (key refresh, config
reload) belong to the app's lifespan, which starts and stops them."""

from __future__ import annotations

import re

from tokenmill.gateway.admin import build_admin_app, is_admin
from tokenmill.gateway.endpoints.chat import ChatAdapter, CompletionAdapter
from tokenmill.gateway.endpoints.embeddings import EmbeddingsAdapter
from tokenmill.gateway.endpoints.models import MODELS_PATH, models_for_key
from tokenmill.gateway.endpoints.responses import ResponsesAdapter
from tokenmill.gateway.exchange import Exchange, filtered_read, json_response
from tokenmill.gateway.keys import bearer_token
from tokenmill.openai.errors import INVALID_REQUEST, error_body

ADAPTERS = {
    "/v1/chat/completions": ChatAdapter(),
    "/v1/completions": CompletionAdapter(),
    "/v1/responses": ResponsesAdapter(),
    "/v1/embeddings": EmbeddingsAdapter(),
}
_STORED_RESPONSE = re.compile(r"/v1/responses/[^/]+")
# what a user key reaches: the OpenAI API, the tokenizer, the UI's data (fail closed: a path
# not matched here, known or not, is the admin's)
USER_PATHS = re.compile(
    r"/v1/(chat/completions|completions|embeddings|models(/[^/]+)*"
    r"|responses(/[^/]+(/cancel|/input_items)?)?"
    r"|files(/[^/]+(/content)?)?|batches(/[^/]+(/cancel)?)?)"
    r"|/(tokenize|detokenize|tokenizer_info|version|health|metrics)|/ui/api/[a-z_]+"
)
KEY_OWNER_PREFIX = "gateway-key:"  # stored objects' owner: "gateway-key:<key id>"
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
        user_path = USER_PATHS.fullmatch(path) is not None
        if state.problem is not None:
            if path == "/v1/usage" and is_admin(gw, header):
                return await self.admin(scope, receive, send)
            admin_path = not user_path or path.startswith("/ui/api/")
            if admin_path and is_admin(gw, header):  # the admin's paths, the dashboard's data
                return await self.app(scope, receive, send)
            gw.metrics.unauthorized.labels(state.problem).inc()
            return await _unauthorized(send, _MESSAGES[state.problem])
        if not user_path and path != "/v1/usage":
            gw.metrics.unauthorized.labels("admin_only").inc()
            message = f"{path[:200]} takes the gateway's admin key"
            return await _refuse(403, message, "permission_error", send, "admin_key_required")
        # the app's owner of stored objects (responses, files, batches): this key, by id, so
        # keys never see each other's objects and a rotated key keeps its own
        owner = KEY_OWNER_PREFIX + state.key.id
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
            inner = {**scope, "headers": headers}
            if state.key.models is not None and path.startswith(MODELS_PATH):
                return await models_for_key(self.app, inner, receive, send, state.key.models)
            return await self.app(inner, receive, send)
        await Exchange(gw, adapter, scope, receive, send, state.key).run()


async def _unauthorized(send, message: str) -> None:
    await _refuse(401, message, INVALID_REQUEST, send, "invalid_api_key")


async def _refuse(status: int, message: str, type_: str, send, code: str | None = None) -> None:
    challenge = [(b"www-authenticate", b"Bearer")] if status == 401 else None
    start, body = json_response(status, error_body(message, type_, code=code), challenge)
    await send(start)
    await send(body)
