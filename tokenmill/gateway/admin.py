"""The admin API (`/admin/...`, the admin key only): keys created, listed, updated, rotated
and revoked; everyone's usage; the guardrail and tool-call audit logs. And `/v1/usage`,
where a key sees its own usage (the admin key: anyone's)."""

from __future__ import annotations

import asyncio
import hmac
import time
from dataclasses import asdict
from typing import Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from tokenmill.gateway.key_spec import KeySpec, stored_fields
from tokenmill.gateway.keys import bearer_token, hash_key, new_key_id, new_secret
from tokenmill.gateway.store import keys_table, queries
from tokenmill.gateway.store.keys_table import StoredKey

GroupBy = Literal["key", "team", "day", "model"]
MAX_ROWS = 1000


def public_key(key: StoredKey) -> dict[str, Any]:
    """A key as shown to admins: everything but its hash."""
    out = asdict(key)
    out.pop("key_hash", None)
    out["user"] = out.pop("user_name", None)
    out["models"] = list(key.models) if key.models is not None else None
    return out


def _error(status: int, message: str, code: str, type_: str = "invalid_request_error"):
    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return JSONResponse(body, status_code=status)


def is_admin(gateway, authorization: bytes) -> bool:
    expected = gateway.config.admin_key_sha256
    token = bearer_token(authorization)
    return bool(expected and token) and hmac.compare_digest(hash_key(token), expected)


def build_admin_app(gateway) -> FastAPI:
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    db = gateway.db

    @app.middleware("http")
    async def admin_only(request: Request, call_next):
        if request.url.path.startswith("/admin") and not is_admin(
            gateway, request.headers.get("authorization", "").encode("latin-1")
        ):
            return _error(401, "the admin API needs the admin key", "invalid_api_key")
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        return _error(400, f"{where}: {first.get('msg', 'invalid')}", "invalid_value")

    async def spec_of(request: Request) -> KeySpec | JSONResponse:
        try:
            raw = await request.json()
            return KeySpec.model_validate(raw)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            return _error(400, f"{where}: {first['msg']}", "invalid_value")
        except ValueError:
            return _error(400, "the body must be a JSON object", "invalid_json")

    def check_policy(spec: KeySpec) -> JSONResponse | None:
        if spec.tool_policy is not None and spec.tool_policy not in gateway.config.tool_policies:
            return _error(
                400, f"tool_policy: no policy named {spec.tool_policy!r}", "invalid_value"
            )
        return None

    @app.post("/admin/keys")
    async def create_key(request: Request):
        spec = await spec_of(request)
        if isinstance(spec, JSONResponse):
            return spec
        if (bad := check_policy(spec)) is not None:
            return bad
        secret, now = new_secret(), time.time()
        key = StoredKey(
            id=new_key_id(), key_hash=hash_key(secret), created=now, updated=now,
            revoked_at=None, **{"metadata": {}, **stored_fields(spec, only_set=False)},
        )  # fmt: skip
        await asyncio.to_thread(keys_table.insert_key, db, key)
        await asyncio.to_thread(gateway.keys.reload)
        return JSONResponse({"key": secret, **public_key(key)}, status_code=201)

    @app.get("/admin/keys")
    async def list_all(include_revoked: bool = False):
        keys = await asyncio.to_thread(keys_table.list_keys, db, include_revoked)
        return {"object": "list", "data": [public_key(k) for k in keys]}

    async def existing(key_id: str) -> StoredKey | JSONResponse:
        key = await asyncio.to_thread(keys_table.get_key, db, key_id[:100])
        return key if key is not None else _error(404, "no such key", "key_not_found")

    @app.get("/admin/keys/{key_id}")
    async def get_one(key_id: str):
        key = await existing(key_id)
        return key if isinstance(key, JSONResponse) else public_key(key)

    @app.patch("/admin/keys/{key_id}")
    async def update(key_id: str, request: Request):
        key = await existing(key_id)
        if isinstance(key, JSONResponse):
            return key
        spec = await spec_of(request)
        if isinstance(spec, JSONResponse):
            return spec
        if (bad := check_policy(spec)) is not None:
            return bad
        await asyncio.to_thread(
            keys_table.update_key, db, key.id, **stored_fields(spec, only_set=True)
        )
        await asyncio.to_thread(gateway.keys.reload)
        return public_key(await asyncio.to_thread(keys_table.get_key, db, key.id))

    @app.post("/admin/keys/{key_id}/rotate")
    async def rotate(key_id: str):
        key = await existing(key_id)
        if isinstance(key, JSONResponse):
            return key
        if key.revoked_at is not None:
            return _error(400, "a revoked key cannot be rotated", "key_revoked")
        secret = new_secret()
        await asyncio.to_thread(keys_table.replace_hash, db, key.id, hash_key(secret))
        await asyncio.to_thread(gateway.keys.reload)
        return {
            "key": secret,
            **public_key(await asyncio.to_thread(keys_table.get_key, db, key.id)),
        }

    @app.delete("/admin/keys/{key_id}")
    async def revoke(key_id: str):
        key = await existing(key_id)
        if isinstance(key, JSONResponse):
            return key
        await asyncio.to_thread(keys_table.revoke_key, db, key.id, time.time())
        await asyncio.to_thread(gateway.keys.reload)
        return {"id": key.id, "object": "key", "revoked": True}

    async def usage_reply(key_id, team, since, until, group_by, rows: bool):
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
                found = queries.usage_rows(
                    db, key_id=key_id, since=since, until=until, limit=MAX_ROWS
                )
                out["requests"] = [asdict(r) for r in found]
            return out

        return await asyncio.to_thread(run)

    @app.get("/admin/usage")
    async def admin_usage(
        key_id: str | None = Query(None, max_length=100),
        team: str | None = Query(None, max_length=200),
        since: float | None = Query(None, ge=0, le=1e11),
        until: float | None = Query(None, ge=0, le=1e11),
        group_by: GroupBy = "key",
    ):
        return await usage_reply(key_id, team, since, until, group_by, rows=False)

    def audit_log(query):
        """A reviewers' log route (`query` one of the store's event listings)."""

        async def route(
            key_id: str | None = Query(None, max_length=100),
            since: float | None = Query(None, ge=0, le=1e11),
            limit: int = Query(100, ge=1, le=MAX_ROWS),
        ):
            def run():
                gateway.ledger.flush(timeout=5.0)  # what was journaled before this call shows
                return query(db, key_id=key_id, since=since, limit=limit)

            found = await asyncio.to_thread(run)
            return {"object": "list", "data": [asdict(e) for e in found]}

        return route

    app.get("/admin/guardrail_events")(audit_log(queries.guardrail_events))
    app.get("/admin/tool_call_events")(audit_log(queries.tool_call_events))

    @app.get("/v1/usage")
    async def own_usage(
        request: Request,
        since: float | None = Query(None, ge=0, le=1e11),
        until: float | None = Query(None, ge=0, le=1e11),
        group_by: GroupBy = "day",
        include_requests: bool = False,
        key_id: str | None = Query(None, max_length=100),
    ):
        key: StoredKey | None = request.scope.get("state", {}).get("gateway_key")
        if key is None:  # the admin key: anyone's usage
            return await usage_reply(key_id, None, since, until, group_by, include_requests)
        if key_id is not None and key_id != key.id:
            return _error(
                403, "a key sees only its own usage", "permission_denied", "permission_error"
            )
        return await usage_reply(key.id, None, since, until, group_by, include_requests)

    return app
