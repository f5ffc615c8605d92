"""The gateway's YAML config (`--gateway-config FILE`): database, admin key, prices, key
defaults, tool policies and guardrails. Every value is checked; an error names its key."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenmill import envs
from tokenmill.cache_dirs import cache_root
from tokenmill.config_file import yaml_error
from tokenmill.gateway.config_values import mapping, number, optional_limit, string
from tokenmill.gateway.errors import GatewayConfigError
from tokenmill.gateway.guardrails import GuardrailsConfig, parse_guardrails
from tokenmill.gateway.tool_policy import UNDEFINED_POLICY, ToolPolicy, parse_tool_policy

MAX_CONFIG_BYTES = 1 << 20
ADMIN_KEY_ENV = envs.ADMIN_KEY.name
DEFAULT_OPEN_PATHS = ("/health", "/version", "/metrics")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_MAX_PRICE = 1e6  # USD per million tokens


@dataclass(frozen=True)
class Price:
    """USD per million tokens; cached prompt tokens at their own (discounted) rate."""

    input: float = 0.0
    cached_input: float = 0.0
    output: float = 0.0

    def cost(self, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> float:
        cached = min(cached_tokens, prompt_tokens)
        return (
            (prompt_tokens - cached) * self.input
            + cached * self.cached_input
            + completion_tokens * self.output
        ) / 1e6


@dataclass(frozen=True)
class KeyDefaults:
    """Limits for keys that set none of their own (None: unlimited)."""

    rpm: int | None = None
    tpm: int | None = None
    max_parallel: int | None = None


@dataclass(frozen=True)
class GatewayConfig:
    database: str
    journal: Path
    admin_key_sha256: str | None = None
    open_paths: tuple[str, ...] = DEFAULT_OPEN_PATHS
    prices: Mapping[str, Price] = field(default_factory=dict)
    default_price: Price = Price()
    defaults: KeyDefaults = KeyDefaults()
    tool_policies: Mapping[str, ToolPolicy] = field(default_factory=dict)
    default_tool_policy: str | None = None
    guardrails: GuardrailsConfig = field(default_factory=lambda: parse_guardrails(None))
    classifier_timeout_s: float = 10.0
    key_refresh_s: float = 1.0

    def price(self, model: str) -> Price:
        return self.prices.get(model, self.default_price)

    def tool_policy(self, name: str | None) -> ToolPolicy | None:
        """The key's policy; the default when it names none (None: no policy). A name this
        config does not define (removed by a reload, or written around the checks) fails
        closed: every tool call is refused."""
        name = name or self.default_tool_policy
        if name is None:
            return None
        policy = self.tool_policies.get(name)
        return policy if policy is not None else UNDEFINED_POLICY


_TOP_KEYS = {
    "database",
    "journal",
    "admin_key_env",
    "admin_key_sha256",
    "open_paths",
    "prices",
    "defaults",
    "tool_policies",
    "default_tool_policy",
    "guardrails",
    "classifier_timeout_s",
    "key_refresh_s",
}


def _price(raw: object, path: str) -> Price:
    values = mapping(raw, path, {"input", "cached_input", "output"})
    price = {k: float(number(v, f"{path}.{k}", 0, _MAX_PRICE)) for k, v in values.items()}
    price.setdefault("cached_input", price.get("input", 0.0))
    return Price(**price)


def _admin_key_sha256(values: dict[str, Any], env: Mapping[str, str] | None) -> str | None:
    if "admin_key_sha256" in values and "admin_key_env" in values:
        raise GatewayConfigError("admin_key_sha256", "give admin_key_sha256 or admin_key_env")
    if "admin_key_sha256" in values:
        digest = string(values["admin_key_sha256"], "admin_key_sha256").lower()
        if not _SHA256_HEX.fullmatch(digest):
            raise GatewayConfigError("admin_key_sha256", "expected 64 hex digits (SHA-256)")
        return digest
    from tokenmill.gateway.keys import hash_key

    name = string(values.get("admin_key_env", ADMIN_KEY_ENV), "admin_key_env", 200)
    key = envs.named(name, env)
    return hash_key(key) if key else None  # no admin key: the admin API answers 401


def default_database() -> str:
    return str(cache_root() / "gateway.sqlite3")


def parse_gateway_config(
    raw: object, base_dir: Path | None = None, env: Mapping[str, str] | None = None
) -> GatewayConfig:
    values = mapping(raw, "", _TOP_KEYS)
    base_dir = base_dir or Path.cwd()
    database = string(values.get("database", default_database()), "database")
    if "://" not in database:
        database = str((base_dir / Path(database).expanduser()).resolve())
    journal = values.get("journal")
    if journal is None:
        local = "://" not in database or database.startswith("sqlite://")
        journal_path = (
            Path(database.removeprefix("sqlite://")).with_suffix(".journal")
            if local
            else cache_root() / "gateway.journal"
        )
    else:
        journal_path = (base_dir / Path(string(journal, "journal")).expanduser()).resolve()
    open_paths = values.get("open_paths", list(DEFAULT_OPEN_PATHS))
    if not isinstance(open_paths, list) or not all(
        isinstance(p, str) and p.startswith("/") for p in open_paths
    ):
        raise GatewayConfigError("open_paths", "expected a list of paths starting with '/'")
    prices = mapping(values.get("prices"), "prices")
    default_price = _price(prices.get("default"), "prices.default")
    model_prices = {
        string(model, "prices"): _price(p, f"prices.{model}")
        for model, p in prices.items()
        if model != "default"
    }
    defaults_raw = mapping(values.get("defaults"), "defaults", {"rpm", "tpm", "max_parallel"})
    defaults = KeyDefaults(
        **{k: optional_limit(v, f"defaults.{k}") for k, v in defaults_raw.items()}
    )
    policies = {
        string(name, "tool_policies"): parse_tool_policy(p, f"tool_policies.{name}")
        for name, p in mapping(values.get("tool_policies"), "tool_policies").items()
    }
    default_policy = values.get("default_tool_policy")
    if default_policy is not None and default_policy not in policies:
        raise GatewayConfigError(
            "default_tool_policy", f"no tool policy named {default_policy!r} in tool_policies"
        )
    return GatewayConfig(
        database=database,
        journal=journal_path,
        admin_key_sha256=_admin_key_sha256(values, env),
        open_paths=tuple(open_paths),
        prices=model_prices,
        default_price=default_price,
        defaults=defaults,
        tool_policies=policies,
        default_tool_policy=default_policy,
        guardrails=parse_guardrails(values.get("guardrails")),
        classifier_timeout_s=float(
            number(values.get("classifier_timeout_s", 10.0), "classifier_timeout_s", 0.1, 600)
        ),
        key_refresh_s=float(number(values.get("key_refresh_s", 1.0), "key_refresh_s", 0.05, 3600)),
    )


def load_gateway_config(path: str | Path, env: Mapping[str, str] | None = None) -> GatewayConfig:
    import yaml

    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise GatewayConfigError("", f"{path} is {size} bytes (at most {MAX_CONFIG_BYTES})")
        raw = yaml.safe_load(path.read_text())
    except OSError as e:
        raise GatewayConfigError("", f"cannot read {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise GatewayConfigError("", yaml_error(path, e)) from None
    if raw is None:  # empty, or comments only: as an editor's save looks for a moment
        raise GatewayConfigError("", f"{path} holds no settings (an empty document)")
    return parse_gateway_config(raw, path.parent.resolve(), env)
