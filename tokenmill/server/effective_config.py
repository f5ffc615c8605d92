"""What a running server was started with, for `/server_info`: the engine configuration
in force (every field of EngineConfig, defaults included) and the server's settings, with
secrets shown only as set or not."""

from __future__ import annotations

import dataclasses
from enum import Enum
from pathlib import Path
from typing import Any

from tokenmill.config import EngineConfig
from tokenmill.server.settings import ServerSettings

_SECRETS = {"api_key"}


def json_safe(value: Any) -> Any:
    """Dataclasses, enums, paths and tuples as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: json_safe(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in value]
    return value


def effective_config(
    config: EngineConfig | None, settings: ServerSettings, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`engine`: EngineConfig as the engine core runs it (None when an in-process engine
    was given without one); `server`: the API process's settings; plus `extra` (the
    serve command's own, e.g. max_queue_len)."""
    server = json_safe(settings)
    for name in _SECRETS:
        if name in server:
            server[name] = "set" if server[name] else None
    engine = json_safe(config) if config is not None else None
    return {"engine": engine, "server": {**server, **(extra or {})}}
