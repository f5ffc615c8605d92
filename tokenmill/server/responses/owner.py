"""Who owns a stored response: only its owner may read, delete, cancel or continue it; anyone
else gets the 404 of a missing id. Without an API key everything is one anonymous owner."""

from __future__ import annotations

import hashlib

from fastapi import Request

ANONYMOUS = ""


def key_owner(api_key: str) -> str:
    """The owner id of a key: a hash, so the database never holds the key itself."""
    return "key:" + hashlib.sha256(api_key.encode()).hexdigest()


def request_owner(request: Request, api_key: str | None) -> str:
    """A gateway that knows each caller's identity sets `request.state.owner` (per-key
    identities); else, with the server's one key, its hash (the middleware has checked the
    bearer token equals it)."""
    owner = getattr(request.state, "owner", None)
    if isinstance(owner, str) and owner:
        return owner
    return key_owner(api_key) if api_key else ANONYMOUS
