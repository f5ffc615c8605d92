"""The server's settings, their defaults and the API key's sources: importable without the
server (the command line builds them before it imports FastAPI)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tokenmill import envs
from tokenmill.server.batch.config import BatchConfig
from tokenmill.server.responses.config import ResponseStoreConfig

API_KEY_ENV = envs.API_KEY.name
DEFAULT_MAX_TOKENS = 2048
# Paths served without the API key unless configured otherwise (--open-path).
DEFAULT_OPEN_PATHS = ("/health", "/metrics")


@dataclass(frozen=True)
class ServerSettings:
    api_key: str | None = None
    open_paths: tuple[str, ...] = DEFAULT_OPEN_PATHS
    max_body_bytes: int = 4 * 1024 * 1024
    # chat requests that give no max_tokens get at most this many (and never more than fits)
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    # requests may ask for control-token strings in messages to be control tokens
    allow_special_tokens_in_content: bool = False
    # chat responses split <think> reasoning into reasoning_content: "auto" (when the chat
    # template speaks <think>), "none", or a parser by name (structured/reasoning.py)
    reasoning_parser: str = "auto"
    # the format tool calls are read in: "auto" (from the chat template), "hermes",
    # "pythonic" or "phi4_mini_json" (structured/call_lists.py)
    tool_call_parser: str = "auto"
    response_store: ResponseStoreConfig = ResponseStoreConfig()
    batch: BatchConfig = BatchConfig(path="off")  # `serve` turns it on (server/batch/config.py)
    # the gateway (keys, limits, ledger, guardrails, tool policy) from this YAML file
    gateway_config: str | None = None


def resolve_api_key(
    key: str | None, key_file: str | None, env: Mapping[str, str] | None = None
) -> str | None:
    """The key from the flag, the file or the environment (in that order); None: no key."""
    if key is not None and key_file is not None:
        raise ValueError("api-key: give --api-key or --api-key-file, not both")
    source = "api-key"
    if key_file is not None:
        key, source = Path(key_file).read_text().strip(), "api-key-file"
    elif key is None:
        key, source = envs.API_KEY.get(env), API_KEY_ENV
        if key is None:
            return None
    if not key or key != key.strip():
        raise ValueError(f"{source}: the key must not be empty or padded with spaces")
    return key
