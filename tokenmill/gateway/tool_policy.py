"""Least-privilege tool calls: which tools a key's model may call and with what arguments.

A proposed call passes when its tool is allowed (by name, and declared in the request),
its arguments are a JSON object valid against the declared `parameters` schema, no string
in them matches a deny pattern, and every URL in them points at an allowed host. A call
that fails is replaced by a refusal in the response; tokenmill never runs tools itself."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import jsonschema_rs

from tokenmill.gateway.config_values import mapping, string
from tokenmill.gateway.errors import GatewayConfigError

DEFAULT_REFUSAL = "The requested tool call was blocked by policy."
MAX_ARGUMENT_BYTES = 256 * 1024
MAX_SCHEMA_BYTES = 64 * 1024
_URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]{0,20}://[^\s\"'<>]+")


@dataclass(frozen=True)
class ToolPolicy:
    allow: frozenset[str] | None = None  # None: any tool the request declares
    validate_arguments: bool = True
    deny_patterns: tuple[re.Pattern[str], ...] = ()
    allowed_hosts: tuple[str, ...] | None = None  # None: any host
    refusal: str = DEFAULT_REFUSAL


# what a key whose policy the config does not define gets: every tool call refused
UNDEFINED_POLICY = ToolPolicy(
    allow=frozenset(),
    refusal="The requested tool call was blocked: this key's tool policy is not defined.",
)


@dataclass(frozen=True)
class ToolCallVerdict:
    allowed: bool
    reason: str | None = None


def parse_tool_policy(raw: object, path: str) -> ToolPolicy:
    keys = {"allow", "validate_arguments", "deny_patterns", "allowed_hosts", "refusal"}
    values = mapping(raw, path, keys)

    def names(key: str) -> tuple[str, ...] | None:
        items = values.get(key)
        if items is None:
            return None
        if not isinstance(items, list):
            raise GatewayConfigError(f"{path}.{key}", "expected a list of strings")
        return tuple(string(x, f"{path}.{key}[{i}]", 256) for i, x in enumerate(items))

    patterns = []
    for i, pattern in enumerate(names("deny_patterns") or ()):
        try:
            patterns.append(re.compile(pattern))
        except re.error as e:
            raise GatewayConfigError(f"{path}.deny_patterns[{i}]", f"bad regex: {e}") from None
    validate = values.get("validate_arguments", True)
    if not isinstance(validate, bool):
        raise GatewayConfigError(f"{path}.validate_arguments", "expected true or false")
    allow = names("allow")
    hosts = names("allowed_hosts")
    return ToolPolicy(
        allow=None if allow is None else frozenset(allow),
        validate_arguments=validate,
        deny_patterns=tuple(patterns),
        allowed_hosts=None if hosts is None else tuple(h.lower() for h in hosts),
        refusal=string(values.get("refusal", DEFAULT_REFUSAL), f"{path}.refusal"),
    )


def declared_tools(body: Mapping[str, Any]) -> dict[str, Any]:
    """name -> parameters schema of the function tools a chat or Responses request declares."""
    tools = body.get("tools")
    out: dict[str, Any] = {}
    if not isinstance(tools, list):
        return out
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        name = fn.get("name")
        if isinstance(name, str):
            out[name] = fn.get("parameters")
    return out


def _strings(value: Any, depth: int = 0) -> Iterator[str]:
    if depth > 64:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v, depth + 1)


def _host_allowed(host: str, allowed: tuple[str, ...]) -> bool:
    for pattern in allowed:
        if pattern.startswith("*."):
            if host.endswith(pattern[1:]) and host != pattern[2:]:
                return True
        elif host == pattern:
            return True
    return False


def _schema_errors(schema: Any, arguments: Any) -> str | None:
    if schema is None:
        return None
    if len(json.dumps(schema)) > MAX_SCHEMA_BYTES:
        return "the tool's parameters schema is too large to check"
    try:
        validator = jsonschema_rs.validator_for(schema)
    except Exception:
        return "the tool's parameters schema is not a valid JSON Schema"
    error = next(iter(validator.iter_errors(arguments)), None)
    return None if error is None else f"arguments do not match the schema: {error.message}"


def check_tool_call(
    policy: ToolPolicy, tools: Mapping[str, Any], name: str, arguments: str
) -> ToolCallVerdict:
    if policy.allow is not None and name not in policy.allow:
        return ToolCallVerdict(False, f"tool {name!r} is not allowed for this key")
    if name not in tools:
        return ToolCallVerdict(False, f"tool {name!r} was not declared in the request")
    if len(arguments) > MAX_ARGUMENT_BYTES:
        return ToolCallVerdict(False, "arguments too large")
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except (json.JSONDecodeError, RecursionError):
        return ToolCallVerdict(False, "arguments are not valid JSON")
    if policy.validate_arguments:
        if not isinstance(parsed, dict):
            return ToolCallVerdict(False, "arguments are not a JSON object")
        problem = _schema_errors(tools[name], parsed)
        if problem is not None:
            return ToolCallVerdict(False, problem)
    for text in _strings(parsed):
        for pattern in policy.deny_patterns:
            if pattern.search(text):
                return ToolCallVerdict(
                    False, f"an argument matches deny pattern {pattern.pattern!r}"
                )
        if policy.allowed_hosts is not None:
            for url in _URL.findall(text):
                host = (urlsplit(url).hostname or "").lower()
                if not _host_allowed(host, policy.allowed_hosts):
                    return ToolCallVerdict(False, f"URL host {host!r} is not allowed")
    return ToolCallVerdict(True)
