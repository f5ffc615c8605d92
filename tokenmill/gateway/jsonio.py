"""JSON for the gateway's hot path (every streamed chunk is parsed and written again): orjson,
with the standard library for what orjson refuses (integers past 64 bits, non-string keys)."""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(obj: Any) -> bytes:
    try:
        return orjson.dumps(obj)
    except TypeError:
        return json.dumps(obj, ensure_ascii=False).encode()


def loads(data: bytes | str) -> Any:
    """Raises ValueError on bad JSON (nesting deeper than orjson's limit included)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        # orjson refuses some inputs the standard library takes (e.g. NaN, huge integers)
        try:
            return json.loads(data)
        except RecursionError:
            raise ValueError("JSON nested too deeply") from None
