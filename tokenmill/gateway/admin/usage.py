"""Usage and audit logs: `/admin/usage` (everyone's, rolled up), the guardrail and
tool-call event logs, and `/v1/usage`, where a key sees its own usage (the admin key:
anyone's). The ledger is flushed first, so what was journaled before the call shows."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Any, Literal

from fastapi import APIRouter, Query, Request

from tokenmill.gateway.admin.common import admin_error, gateway_of
from tokenmill.gateway.store import queries
from tokenmill.gateway.store.keys_table import StoredKey

router = APIRouter()
GroupBy = Literal["key", "team", "day", "model"]
MAX_ROWS = 1000


async def _usage_reply(gateway, key_id, team, since, until, group_by, rows: bool):
    db = gateway.db

    def run():
        gateway.ledger.flush(timeout=5.0)
        out: dict[str, Any] = {
            "object": "list",
            "group_by": group_by,
            "data": queries.usage_rollup(
                db, key_id=key_id, team=team, since=since, until=until, group_by=group_by
            ),  # fmt: skip
        }
        if rows:
            found = queries.usage_rows(db, key_id=key_id, since=since, until=until, limit=MAX_ROWS)
            out["requests"] = [asdict(r) for r in found]
        return out

    return await asyncio.to_thread(run)


@router.get("/admin/usage")
async def admin_usage(
    request: Request,
    key_id: str | None = Query(None, max_length=100),
    team: str | None = Query(None, max_length=200),
    since: float | None = Query(None, ge=0, le=1e11),
    until: float | None = Query(None, ge=0, le=1e11),
    group_by: GroupBy = "key",
):
    gateway = gateway_of(request)
    return await _usage_reply(gateway, key_id, team, since, until, group_by, rows=False)


async def _events(request: Request, query, key_id, since, limit) -> dict[str, Any]:
    """A reviewers' log (`query` one of the store's event listings)."""
    gateway = gateway_of(request)

    def run():
        gateway.ledger.flush(timeout=5.0)  # what was journaled before this call shows
        return query(gateway.db, key_id=key_id, since=since, limit=limit)

    found = await asyncio.to_thread(run)
    return {"object": "list", "data": [asdict(e) for e in found]}


@router.get("/admin/guardrail_events")
async def guardrail_events(
    request: Request,
    key_id: str | None = Query(None, max_length=100),
    since: float | None = Query(None, ge=0, le=1e11),
    limit: int = Query(100, ge=1, le=MAX_ROWS),
):
    return await _events(request, queries.guardrail_events, key_id, since, limit)


@router.get("/admin/tool_call_events")
async def tool_call_events(
    request: Request,
    key_id: str | None = Query(None, max_length=100),
    since: float | None = Query(None, ge=0, le=1e11),
    limit: int = Query(100, ge=1, le=MAX_ROWS),
):
    return await _events(request, queries.tool_call_events, key_id, since, limit)


@router.get("/v1/usage")
async def own_usage(
    request: Request,
    since: float | None = Query(None, ge=0, le=1e11),
    until: float | None = Query(None, ge=0, le=1e11),
    group_by: GroupBy = "day",
    include_requests: bool = False,
    key_id: str | None = Query(None, max_length=100),
):
    gateway = gateway_of(request)
    key: StoredKey | None = request.scope.get("state", {}).get("gateway_key")
    if key is None:  # the admin key: anyone's usage
        return await _usage_reply(gateway, key_id, None, since, until, group_by, include_requests)
    if key_id is not None and key_id != key.id:
        return admin_error(
            403, "a key sees only its own usage", "permission_denied", "permission_error"
        )
    return await _usage_reply(gateway, key.id, None, since, until, group_by, include_requests)
