"""API keys: `Authorization: Bearer KEY` on every path but the open ones (deny by default,
so a new endpoint is never open by mistake). The key comes from --api-key, --api-key-file
or $TOKENMILL_API_KEY (the last two keep it out of `ps`) and is compared in constant time."""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from tokenmill.server.errors import error_body

API_KEY_ENV = "TOKENMILL_API_KEY"


def resolve_api_key(
    key: str | None, key_file: str | None, env: Mapping[str, str] = os.environ
) -> str | None:
    """The key from the flag, the file or the environment (in that order); None: no key."""
    if key is not None and key_file is not None:
        raise ValueError("api-key: give --api-key or --api-key-file, not both")
    source = "api-key"
    if key_file is not None:
        key, source = Path(key_file).read_text().strip(), "api-key-file"
    elif key is None:
        key, source = env.get(API_KEY_ENV), API_KEY_ENV
        if key is None:
            return None
    if not key or key != key.strip():
        raise ValueError(f"{source}: the key must not be empty or padded with spaces")
    return key


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
