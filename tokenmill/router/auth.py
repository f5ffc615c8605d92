"""The router's API key: the server's mechanism (tokenmill/server/auth.py: deny by default,
constant-time comparison, key from flag, file or $TOKENMILL_API_KEY) with the router's open
paths: /health and /version, and /metrics unless --protect-metrics."""

from __future__ import annotations

from tokenmill.server.auth import API_KEY_ENV, APIKeyMiddleware, bearer_matches, resolve_api_key

OPEN_PATHS = frozenset({"/health", "/version"})

__all__ = ["API_KEY_ENV", "APIKeyMiddleware", "bearer_matches", "open_paths", "resolve_api_key"]


def open_paths(protect_metrics: bool) -> frozenset[str]:
    return OPEN_PATHS if protect_metrics else OPEN_PATHS | {"/metrics"}
