"""API keys: `Authorization: Bearer KEY` on every path but the open ones (deny by default,
so a new endpoint is never open by mistake). The key comes from --api-key, --api-key-file
or $TOKENMILL_API_KEY (the last two keep it out of `ps`) and is compared in constant time."""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable

from tokenmill.server.errors import error_body
from tokenmill.server.settings import API_KEY_ENV, resolve_api_key

__all__ = ["API_KEY_ENV", "APIKeyMiddleware", "bearer_matches", "resolve_api_key"]


def bearer_matches(header: bytes, key: bytes) -> bool:
    """Constant-time comparison of the token (timing tells nothing about the key)."""
    scheme, _, token = header.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(token, key)


_UNAUTHORIZED = json.dumps(
    error_body("Incorrect or missing API key.", "invalid_request_error", None, "invalid_api_key")
).encode()


class APIKeyMiddleware:
    """Pure ASGI, so streams and disconnects pass through untouched."""

    def __init__(self, app, api_key: str, open_paths: Iterable[str]) -> None:
        self.app = app
        self.key = api_key.encode()
        self.open = frozenset(open_paths)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.open:
            header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not bearer_matches(header, self.key):
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b"Bearer"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": _UNAUTHORIZED})
                return
        await self.app(scope, receive, send)
