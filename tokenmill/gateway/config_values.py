"""A YAML config's values, checked: each error names the key it is about (the gateway
config and the tool policies in it)."""

from __future__ import annotations

from typing import Any

from tokenmill.gateway.errors import GatewayConfigError


def mapping(raw: object, path: str, allowed: set[str] | None = None) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise GatewayConfigError(path, f"expected a mapping, got {type(raw).__name__}")
    for key in raw:
        if not isinstance(key, str):
            raise GatewayConfigError(path, f"keys must be strings, got {key!r}")
        if allowed is not None and key not in allowed:
            raise GatewayConfigError(
                f"{path}.{key}" if path else key,
                f"unknown key (expected one of: {', '.join(sorted(allowed))})",
            )
    return raw


def number(raw: object, path: str, low: float, high: float, integer: bool = False) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise GatewayConfigError(path, f"expected a number, got {raw!r}")
    if integer and not isinstance(raw, int):
        raise GatewayConfigError(path, f"expected an integer, got {raw!r}")
    if not low <= raw <= high:
        raise GatewayConfigError(path, f"must be between {low:g} and {high:g}, got {raw!r}")
    return raw


def optional_limit(raw: object, path: str) -> int | None:
    return None if raw is None else int(number(raw, path, 1, 1e12, integer=True))


def string(raw: object, path: str, max_len: int = 4096) -> str:
    if not isinstance(raw, str) or not raw:
        raise GatewayConfigError(path, f"expected a non-empty string, got {raw!r}")
    if len(raw) > max_len:
        raise GatewayConfigError(path, f"longer than {max_len} characters")
    return raw
