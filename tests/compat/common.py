"""Shared pieces of the third-party client compatibility suite."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

from tests.server.conftest import MODEL

__all__ = ["DATA", "MODEL", "SKIP_REASON", "WEATHER_SCHEMA", "WEATHER_TOOL", "check_args"]

SKIP_REASON = "compat extra not installed (pip install -e '.[compat]'; scripts/setup.sh does it)"
DATA = Path(__file__).parent / "data"

# Bounded strings keep a 135M model's arguments short enough to finish inside max_tokens.
WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": WEATHER_SCHEMA,
    },
}


def check_args(arguments: str | dict, schema: dict = WEATHER_SCHEMA) -> dict:
    """Tool-call arguments (a JSON string or an already parsed dict) valid against `schema`."""
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, schema)
    return args
