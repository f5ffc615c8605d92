"""Read-side queries over the ledger's tables: spend, rollups, rows, totals, event lists.

Plain blocking calls: run them from a worker thread (e.g. `asyncio.to_thread`); each thread
uses its own connection of the Database.
"""

from __future__ import annotations

from typing import Any, Literal

from tokenmill.gateway.store.database import Database
from tokenmill.gateway.store.records import GuardrailEvent, ToolCallEvent, UsageRecord

GroupBy = Literal["key", "team", "day", "model", "user"]
_GROUP_COLUMN = {"key": "key_id", "team": "team", "model": "model", "user": "user_name"}
# the field that holds a rollup row's group
GROUP_FIELD = {**_GROUP_COLUMN, "day": "day"}
_METRICS = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens", "cost_usd")
_SUMS = (
    "COUNT(*), COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(cached_tokens), 0), "
    "COALESCE(SUM(completion_tokens), 0), COALESCE(SUM(cost_usd), 0)"
)


def _where(**conditions: tuple[str, Any]) -> tuple[str, list[Any]]:
    """`WHERE ...` from {name: (sql, value)}, skipping None values; `value` fills every `?`
    in its `sql`."""
    parts, params = [], []
    for sql, value in conditions.values():
        if value is not None:
            parts.append(sql)
            params.extend([value] * sql.count("?"))
    return (" WHERE " + " AND ".join(parts) if parts else ""), params


def _metrics(values: tuple) -> dict[str, Any]:
    out = dict(zip(_METRICS, values, strict=True))
    for name in _METRICS[:-1]:
        out[name] = int(out[name])
    out["cost_usd"] = float(out["cost_usd"])
    return out


def spend(db: Database, key_id: str, since: float) -> float:
    """Dollars `key_id` has spent since `since` (epoch seconds)."""
    row = db.fetchone(
        "SELECT COALESCE(SUM(cost_usd), 0) FROM usage WHERE key_id = ? AND created >= ?",
        (key_id, since),
    )
    return float(row[0]) if row else 0.0


def team_spend(db: Database, team: str, since: float) -> float:
    """Dollars `team` has spent since `since` (epoch seconds)."""
    row = db.fetchone(
        "SELECT COALESCE(SUM(cost_usd), 0) FROM usage WHERE team = ? AND created >= ?",
        (team, since),
    )
    return float(row[0]) if row else 0.0


def usage_rollup(
    db: Database,
    *,
    group_by: GroupBy,
    key_id: str | None = None,
    team: str | None = None,
    since: float | None = None,
    until: float | None = None,
) -> list[dict[str, Any]]:
    """Requests, tokens and cost per group, ordered by group; `since` inclusive, `until`
    exclusive. Each dict has the group under "key_id", "team", "day" (UTC 'YYYY-MM-DD'),
    "model" or "user_name" (GROUP_FIELD), then the metrics; by key, the key's "key_name"
    follows its id (None: unnamed, or no key)."""
    if group_by == "day":
        name, expr = "day", db.utc_day("created")
    elif group_by in _GROUP_COLUMN:
        name = expr = _GROUP_COLUMN[group_by]
    else:
        raise ValueError(f"group_by must be one of key, team, day, model, user: {group_by!r}")
    where, params = _where(
        key=("key_id = ?", key_id),
        team=("team = ?", team),
        since=("created >= ?", since),
        until=("created < ?", until),
    )
    rows = db.fetchall(
        f"SELECT {expr} AS g, {_SUMS} FROM usage{where} GROUP BY g ORDER BY g", params
    )
    if group_by == "key":
        names = key_names(db, [r[0] for r in rows if r[0] is not None])
        return [{name: r[0], "key_name": names.get(r[0]), **_metrics(r[1:])} for r in rows]
    return [{name: r[0], **_metrics(r[1:])} for r in rows]


def key_names(db: Database, key_ids: list[str]) -> dict[str, str | None]:
    """The name of each of these keys (revoked ones too) that `api_keys` holds."""
    out: dict[str, str | None] = {}
    for start in range(0, len(key_ids), 500):  # bounded parameter lists
        chunk = key_ids[start : start + 500]
        marks = ", ".join("?" * len(chunk))
        for key_id, name in db.fetchall(
            f"SELECT id, name FROM api_keys WHERE id IN ({marks})", chunk
        ):
            out[key_id] = name
    return out


def totals(db: Database, key_id: str | None = None) -> dict[str, Any]:
    """All-time requests, token counts ("tokens" = prompt + completion) and cost."""
    where, params = _where(key=("key_id = ?", key_id))
    row = db.fetchone(f"SELECT {_SUMS} FROM usage{where}", params)
    assert row is not None
    out = _metrics(row)
    out["tokens"] = out["prompt_tokens"] + out["completion_tokens"]
    return out


def usage_rows(
    db: Database,
    *,
    key_id: str | None = None,
    team: str | None = None,
    since: float | None = None,
    until: float | None = None,
    limit: int = 100,
    after_request_id: str | None = None,
    offset: int = 0,
    newest_first: bool = False,
) -> list[UsageRecord]:
    """Usage rows ordered by (created, request_id). Page with `after_request_id` (the last
    row's id of the previous page; stable while rows arrive) or with `offset`."""
    cmp = "<" if newest_first else ">"
    where, params = _where(
        key=("key_id = ?", key_id),
        team=("team = ?", team),
        since=("created >= ?", since),
        until=("created < ?", until),
        after=(
            f"(created {cmp} (SELECT created FROM usage WHERE request_id = ?)"
            f" OR (created = (SELECT created FROM usage WHERE request_id = ?)"
            f" AND request_id {cmp} ?))",
            after_request_id,
        ),
    )
    order = "DESC" if newest_first else "ASC"
    sql = (
        f"SELECT {', '.join(UsageRecord.COLUMNS)} FROM usage{where}"
        f" ORDER BY created {order}, request_id {order} LIMIT ? OFFSET ?"
    )
    return [UsageRecord(*r) for r in db.fetchall(sql, [*params, limit, offset])]


def guardrail_events(
    db: Database,
    *,
    key_id: str | None = None,
    request_id: str | None = None,
    since: float | None = None,
    limit: int = 100,
) -> list[GuardrailEvent]:
    """Guardrail events, newest first."""
    where, params = _where(
        key=("key_id = ?", key_id),
        request=("request_id = ?", request_id),
        since=("created >= ?", since),
    )
    cols = ", ".join(GuardrailEvent.COLUMNS)
    rows = db.fetchall(
        f"SELECT {cols} FROM guardrail_events{where} ORDER BY created DESC, id DESC LIMIT ?",
        [*params, limit],
    )
    return [GuardrailEvent(*r) for r in rows]


def tool_call_events(
    db: Database,
    *,
    key_id: str | None = None,
    request_id: str | None = None,
    since: float | None = None,
    allowed: bool | None = None,
    limit: int = 100,
) -> list[ToolCallEvent]:
    """Tool-call events, newest first; `allowed=False` lists only the blocked calls."""
    where, params = _where(
        key=("key_id = ?", key_id),
        request=("request_id = ?", request_id),
        since=("created >= ?", since),
        allowed=("allowed = ?", None if allowed is None else int(allowed)),
    )
    cols = ", ".join(ToolCallEvent.COLUMNS)
    rows = db.fetchall(
        f"SELECT {cols} FROM tool_call_events{where} ORDER BY created DESC, id DESC LIMIT ?",
        [*params, limit],
    )
    return [_tool_call(r) for r in rows]


def _tool_call(row: tuple) -> ToolCallEvent:
    values = dict(zip(ToolCallEvent.COLUMNS, row, strict=True))
    values["allowed"] = bool(values["allowed"])
    return ToolCallEvent(**values)
