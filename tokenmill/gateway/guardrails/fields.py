"""Typed reads of one config mapping, every error naming its dotted path; unknown keys are
errors too (`Fields.done`)."""

from __future__ import annotations

import math

from tokenmill.gateway.errors import GatewayConfigError

_MISSING = object()


class Fields:
    def __init__(self, raw: object, path: str) -> None:
        if not isinstance(raw, dict):
            raise GatewayConfigError(path, f"expected a mapping, got {type(raw).__name__}")
        self.raw = raw
        self.path = path
        self.seen: set[str] = set()

    def at(self, key: str) -> str:
        return f"{self.path}.{key}"

    def has(self, key: str) -> bool:
        return key in self.raw

    def get(self, key: str, default: object = _MISSING) -> object:
        self.seen.add(key)
        if key in self.raw:
            return self.raw[key]
        if default is _MISSING:
            raise GatewayConfigError(self.at(key), "is required")
        return default

    def text(
        self, key: str, default: object = _MISSING, *, max_len: int = 10_000, empty: bool = False
    ) -> str:
        return as_str(self.get(key, default), self.at(key), max_len=max_len, empty=empty)

    def integer(self, key: str, default: object, low: int, high: int) -> int:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise GatewayConfigError(self.at(key), f"expected an integer, got {value!r}")
        if not low <= value <= high:
            raise GatewayConfigError(self.at(key), f"must be between {low} and {high}, got {value}")
        return value

    def number(self, key: str, default: object, low: float, high: float) -> float:
        value = self.get(key, default)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise GatewayConfigError(self.at(key), f"expected a number, got {value!r}")
        if not low <= value <= high:
            raise GatewayConfigError(self.at(key), f"must be between {low} and {high}, got {value}")
        return float(value)

    def choice(self, key: str, default: object, options: tuple[str, ...]) -> str:
        value = self.get(key, default)
        if value not in options:
            raise GatewayConfigError(
                self.at(key), f"must be one of {', '.join(options)}, got {value!r}"
            )
        return str(value)

    def str_list(
        self, key: str, default: object, *, max_items: int, max_len: int
    ) -> tuple[str, ...]:
        value = self.get(key, default)
        if not isinstance(value, list) or not value:
            raise GatewayConfigError(self.at(key), "expected a non-empty list")
        if len(value) > max_items:
            raise GatewayConfigError(self.at(key), f"at most {max_items} items, got {len(value)}")
        return tuple(
            as_str(v, f"{self.at(key)}[{i}]", max_len=max_len) for i, v in enumerate(value)
        )

    def done(self) -> None:
        unknown = sorted(str(k) for k in self.raw if k not in self.seen)
        if unknown:
            raise GatewayConfigError(self.at(unknown[0]), "unknown key")


def as_str(value: object, path: str, *, max_len: int = 10_000, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise GatewayConfigError(path, f"expected a string, got {value!r}")
    if not value.strip() and not empty:
        raise GatewayConfigError(path, "must not be empty")
    if len(value) > max_len:
        raise GatewayConfigError(path, f"at most {max_len} characters, got {len(value)}")
    return value
