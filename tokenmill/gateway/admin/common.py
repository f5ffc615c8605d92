"""What the admin routes share: who holds the admin key, a key as admins see it, and the
error envelope of the admin API."""

from __future__ import annotations

import hmac
from dataclasses import asdict
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from tokenmill.gateway.keys import bearer_token, hash_key
from tokenmill.gateway.store.keys_table import StoredKey
from tokenmill.openai.errors import error_body


def gateway_of(request: Request):
    """The Gateway the admin app serves (build_admin_app puts it in app.state.gateway)."""
    return request.app.state.gateway


def public_key(key: StoredKey) -> dict[str, Any]:
    """A key as shown to admins: everything but its hash."""
    out = asdict(key)
    out.pop("key_hash", None)
    out["user"] = out.pop("user_name", None)
    out["models"] = list(key.models) if key.models is not None else None
    return out


def admin_error(status: int, message: str, code: str, type_: str = "invalid_request_error"):
    return JSONResponse(error_body(message, type_, None, code), status_code=status)


def is_admin(gateway, authorization: bytes) -> bool:
    expected = gateway.config.admin_key_sha256
    token = bearer_token(authorization)
    return bool(expected and token) and hmac.compare_digest(hash_key(token), expected)
