"""`tokenmill keys ...`, `tokenmill usage` and `tokenmill gateway migrate`: the gateway's
database from the command line (the same one `serve --gateway-config` uses; a running
server sees key changes within `key_refresh_s`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.table import Table

_DURATION = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _database_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--gateway-config", metavar="FILE", help="the gateway config (its database)")
    g.add_argument("--database", metavar="URL", help="SQLite path or postgresql:// URL")


def _open(args: argparse.Namespace, reading: bool = False):
    """The gateway's database, its schema brought up to date. `reading` (listing keys or
    usage): a SQLite file that is not there is an error, not a new empty database."""
    from tokenmill.gateway.config import default_database, load_gateway_config

    if args.gateway_config:
        url = load_gateway_config(args.gateway_config).database
    else:
        url = args.database or default_database()
    return _migrated(url, reading)


def _migrated(url: str, reading: bool = False):
    from tokenmill.gateway.store.database import open_database
    from tokenmill.gateway.store.migrations import migrate
    from tokenmill.gateway.store.url import parse_url, redact_url

    parsed = parse_url(url)
    if reading and parsed.dialect == "sqlite" and parsed.path and not parsed.path.exists():
        raise ValueError(f"database: no gateway database at {parsed.path}")
    db = open_database(url)
    try:
        migrate(db)
    except ValueError:
        raise
    except Exception as e:  # not a database, a server that cannot be reached, ...
        raise ValueError(f"database: {redact_url(url)}: {e}") from None
    return db


def _duration(text: str) -> float:
    unit = _DURATION.get(text[-1:])
    try:
        return float(text[:-1]) * unit if unit else float(text)
    except ValueError:
        raise ValueError(f"expected a duration like 30d, 12h or 3600, got {text!r}") from None


def _key_fields(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name")
    p.add_argument("--team")
    p.add_argument("--user")
    p.add_argument("--models", help="comma-separated models the key may use (default: all)")
    p.add_argument("--rpm", type=int, help="requests per minute")
    p.add_argument("--tpm", type=int, help="tokens per minute (prompt + completion)")
    p.add_argument("--max-parallel", type=int)
    p.add_argument("--budget-usd", type=float)
    p.add_argument("--budget-period", choices=["day", "month", "total"])
    p.add_argument("--tool-policy", help="a tool policy named in the gateway config")
    p.add_argument("--metadata", action="append", metavar="K=V", help="repeatable")
    p.add_argument("--expires-in", metavar="DURATION", help="e.g. 90d, 12h")


def _spec(args: argparse.Namespace):
    from pydantic import ValidationError

    from tokenmill.gateway.key_spec import KeySpec

    raw: dict = {}
    for name in ("name", "team", "user", "rpm", "tpm", "max_parallel", "budget_usd",
                 "budget_period", "tool_policy"):  # fmt: skip
        if getattr(args, name) is not None:
            raw[name] = getattr(args, name)
    if args.models is not None:
        raw["models"] = [m.strip() for m in args.models.split(",") if m.strip()]
    if args.metadata:
        pairs = [item.partition("=") for item in args.metadata]
        if any(not sep for _, sep, _ in pairs):
            raise ValueError("metadata: expected K=V")
        raw["metadata"] = {k: v for k, _, v in pairs}
    if args.expires_in is not None:
        lifetime = _duration(args.expires_in)
        if lifetime <= 0:
            raise ValueError(f"expires-in: must be positive, got {args.expires_in!r}")
        raw["expires_at"] = time.time() + lifetime
    try:
        spec = KeySpec.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        raise ValueError(f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    if spec.tool_policy is not None:
        _check_policy(args, spec.tool_policy)
    return spec


def _check_policy(args: argparse.Namespace, name: str) -> None:
    """A key's tool policy must be one the config defines (as the admin API checks): a name
    the gateway does not know would refuse every tool call of the key."""
    from tokenmill.gateway.config import load_gateway_config

    if not args.gateway_config:
        raise ValueError(
            "--tool-policy: give --gateway-config FILE (the policy is checked against its "
            "tool_policies)"
        )
    policies = load_gateway_config(args.gateway_config).tool_policies
    if name not in policies:
        known = ", ".join(sorted(policies)) or "none"
        raise ValueError(
            f"--tool-policy: no policy named {name!r} in the config (defined: {known})"
        )


# a key's times: epoch seconds in the database and the admin API, ISO-8601 UTC here
_KEY_TIMES = ("created", "updated", "expires_at", "revoked_at")


def _show(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))


def iso_utc(t: float) -> str:
    """Epoch seconds as ISO-8601 UTC to the second, e.g. 2026-01-31T12:00:00Z."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _shown_key(key, secret: str | None = None) -> dict:
    """A key as the CLI prints it: the admin API's fields, times in ISO-8601 UTC."""
    from tokenmill.gateway.admin import public_key

    out = public_key(key)
    for name in _KEY_TIMES:
        if out.get(name) is not None:
            out[name] = iso_utc(out[name])
    return out if secret is None else {"key": secret, **out}


def cmd_keys(args: argparse.Namespace) -> int:
    from tokenmill.gateway.key_spec import stored_fields
    from tokenmill.gateway.keys import hash_key, new_key_id, new_secret
    from tokenmill.gateway.store import keys_table
    from tokenmill.gateway.store.keys_table import StoredKey

    action = args.keys_action
    db = _open(args, reading=action in ("list", "show"))
    if action == "create":
        secret, now = new_secret(), time.time()
        fields = {"metadata": {}, **stored_fields(_spec(args), only_set=False)}
        key = StoredKey(id=new_key_id(), key_hash=hash_key(secret), created=now, updated=now,
                        revoked_at=None, **fields)  # fmt: skip
        keys_table.insert_key(db, key)
        print(f"key: {secret}", file=sys.stderr)
        print("(shown once: only its hash is stored)", file=sys.stderr)
        _show(_shown_key(key, secret))
        return 0
    if action == "list":
        keys = keys_table.list_keys(db, include_revoked=args.all)
        _show([_shown_key(k) for k in keys])
        return 0
    key = keys_table.get_key(db, args.key_id)
    if key is None:
        raise ValueError(f"no key {args.key_id!r}")
    if action == "show":
        _show(_shown_key(key))
    elif action == "update":
        keys_table.update_key(db, key.id, **stored_fields(_spec(args), only_set=True))
        _show(_shown_key(keys_table.get_key(db, key.id)))
    elif action == "rotate":
        secret = new_secret()
        keys_table.replace_hash(db, key.id, hash_key(secret))
        print(f"key: {secret}", file=sys.stderr)
        _show(_shown_key(keys_table.get_key(db, key.id), secret))
    elif action == "revoke":
        keys_table.revoke_key(db, key.id, time.time())
        print(f"revoked {key.id}")
    return 0


def _since(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        return time.time() - _duration(text)
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()  # naive: UTC


def cmd_usage(args: argparse.Namespace) -> int:
    from tokenmill.console import OutputConsole
    from tokenmill.gateway.store import queries

    db = _open(args, reading=True)
    rows = queries.usage_rollup(
        db, key_id=args.key, team=args.team, since=_since(args.since), until=_since(args.until),
        group_by=args.group_by,
    )  # fmt: skip
    if args.json:
        _show(rows)
        return 0
    OutputConsole(width=None if sys.stdout.isatty() else 160).print(
        _usage_table(rows, args.group_by)
    )
    return 0


def _usage_table(rows: list[dict], group_by: str) -> Table:
    """By key: the key's id and name; else the day, team, model or user."""
    from rich.table import Table

    from tokenmill.gateway.store.queries import GROUP_FIELD

    groups = [GROUP_FIELD[group_by], *(["key_name"] if group_by == "key" else [])]
    metrics = ["requests", "prompt_tokens", "cached_tokens", "completion_tokens", "cost_usd"]
    cells = [
        ["-" if row[c] is None else str(row[c]) for c in groups]
        + [f"{row[c]:.6f}" if c == "cost_usd" else str(row[c]) for c in metrics]
        for row in rows
    ]
    table = Table(title=f"usage by {group_by}")
    for i, c in enumerate(groups + metrics):  # values whole: an id is copied, never cut short
        width = max((len(line[i]) for line in cells), default=0)
        table.add_column(c, justify="left" if c in groups else "right", min_width=width)
    for line in cells:
        table.add_row(*line)
    return table


def cmd_migrate(args: argparse.Namespace) -> int:
    from tokenmill.gateway.config import default_database, load_gateway_config
    from tokenmill.gateway.store.database import open_database
    from tokenmill.gateway.store.migrations import migrate
    from tokenmill.gateway.store.url import redact_url

    url = (
        load_gateway_config(args.gateway_config).database
        if args.gateway_config
        else args.database or default_database()
    )
    try:
        before, after = migrate(open_database(url))
    except ValueError:
        raise
    except Exception as e:  # not a database, a server that cannot be reached, ...
        raise ValueError(f"database: {redact_url(url)}: {e}") from None
    print(f"{redact_url(url)}: schema version {before} -> {after}")
    return 0


def add_gateway_parsers(sub) -> None:
    keys = sub.add_parser(
        "keys", help="gateway API keys: create, list, show, update, rotate, revoke"
    )
    actions = keys.add_subparsers(dest="keys_action", required=True)
    create = actions.add_parser("create", help="a new key (printed once)")
    _key_fields(create)
    listing = actions.add_parser("list")
    listing.add_argument("--all", action="store_true", help="revoked keys too")
    for name in ("show", "update", "rotate", "revoke"):
        p = actions.add_parser(name)
        p.add_argument("key_id")
        if name == "update":
            _key_fields(p)
    for p in (
        create,
        listing,
        *[actions.choices[n] for n in ("show", "update", "rotate", "revoke")],
    ):
        _database_args(p)
    keys.set_defaults(func=cmd_keys)

    usage = sub.add_parser("usage", help="spend and tokens from the gateway's ledger")
    _database_args(usage)
    usage.add_argument("--key", help="one key id")
    usage.add_argument("--team")
    usage.add_argument("--since", help="ISO date/time (UTC) or a duration back, e.g. 7d")
    usage.add_argument("--until")
    usage.add_argument("--group-by", choices=["key", "team", "day", "model"], default="day")
    usage.add_argument("--json", action="store_true")
    usage.set_defaults(func=cmd_usage)

    gateway = sub.add_parser("gateway", help="gateway database maintenance")
    gw_actions = gateway.add_subparsers(dest="gateway_action", required=True)
    migrate = gw_actions.add_parser("migrate", help="create or upgrade the schema")
    _database_args(migrate)
    migrate.set_defaults(func=cmd_migrate)
