"""A model folder's own pooling, as sentence-transformers saved it: `modules.json` lists the
modules (a `Pooling` one in `1_Pooling/`, maybe a `Normalize` one) and the Pooling module's
`config.json` names the mode (`pooling_mode_mean_tokens`, `pooling_mode_cls_token`,
`pooling_mode_lasttoken`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

_MODES = {
    "pooling_mode_lasttoken": "LAST",
    "pooling_mode_mean_tokens": "MEAN",
    "pooling_mode_cls_token": "CLS",
}


@dataclass(frozen=True)
class PoolingConfig:
    pooling_type: str  # "LAST" | "MEAN" | "CLS"
    normalize: bool  # the folder's modules end with Normalize


def _read(path: Path) -> dict | list | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_pooling_config(folder: Path, default_type: str) -> PoolingConfig:
    """The folder's pooling; `default_type` where it has none (or it is not a folder)."""
    modules = _read(folder / "modules.json") if folder.is_dir() else None
    if not isinstance(modules, list):
        return PoolingConfig(default_type, True)
    kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules if isinstance(m, dict)}
    pooling_type = default_type
    pooling = kinds.get("Pooling")
    if pooling is not None:
        config = _read(folder / str(pooling.get("path", "1_Pooling")) / "config.json")
        if isinstance(config, dict):
            chosen = [mode for key, mode in _MODES.items() if config.get(key)]
            if len(chosen) != 1:
                raise ValueError(
                    f"{folder}/1_Pooling/config.json: expected one of {sorted(_MODES)} set, "
                    f"got {chosen or 'none'} (max/weighted pooling is not supported)"
                )
            pooling_type = chosen[0]
    return PoolingConfig(pooling_type, "Normalize" in kinds)
