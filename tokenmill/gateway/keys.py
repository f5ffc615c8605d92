"""API keys: made here, shown once, stored only as their SHA-256 (a key has 256 random
bits, so a plain hash is as strong as a slow one), looked up by that hash and compared in
constant time. `KeyRing` is the server's in-memory view of the key table, refreshed when
another process (`tokenmill keys ...`) changes it."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import time
from dataclasses import dataclass

from tokenmill.gateway.store.keys_table import StoredKey, list_keys, max_updated

logger = logging.getLogger("tokenmill.gateway")

KEY_PREFIX = "tm-"
MAX_KEY_CHARS = 256


def new_secret() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def new_key_id() -> str:
    return "key_" + secrets.token_hex(8)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def bearer_token(header: bytes) -> str | None:
    scheme, _, token = header.partition(b" ")
    if scheme.lower() != b"bearer" or not token or len(token) > MAX_KEY_CHARS:
        return None
    try:
        return token.strip().decode("ascii")
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True)
class KeyState:
    """Why a presented key is not usable (None: it is)."""

    key: StoredKey | None
    problem: str | None


class KeyRing:
    """hash -> key, for all keys that are not revoked; reloaded whole when `updated` moves."""

    def __init__(self, db) -> None:
        self.db = db
        self.by_hash: dict[str, StoredKey] = {}
        self.version = -1.0

    def reload(self) -> None:
        version = max_updated(self.db) or 0.0
        if version == self.version:
            return
        self.by_hash = {k.key_hash: k for k in list_keys(self.db, include_revoked=False)}
        self.version = version

    async def refresh_forever(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await asyncio.to_thread(self.reload)
            except Exception as e:  # the database may be briefly away: keep the last view
                logger.warning("gateway: key refresh failed: %s", e)

    def check(self, token: str | None, now: float | None = None) -> KeyState:
        if token is None:
            return KeyState(None, "missing")
        digest = hash_key(token)
        key = self.by_hash.get(digest)
        if key is None or not hmac.compare_digest(key.key_hash, digest):
            return KeyState(None, "unknown")
        return _live(key, now)

    def check_id(self, key_id: str, now: float | None = None) -> KeyState:
        """As check, for the key with this id: a batch's lines run as the key that made it."""
        key = next((k for k in self.by_hash.values() if k.id == key_id), None)
        return KeyState(None, "unknown") if key is None else _live(key, now)


def _live(key: StoredKey, now: float | None) -> KeyState:
    now = time.time() if now is None else now
    if key.revoked_at is not None and key.revoked_at <= now:
        return KeyState(key, "revoked")
    if key.expires_at is not None and key.expires_at <= now:
        return KeyState(key, "expired")
    return KeyState(key, None)
