"""`/admin/keys`: gateway keys created (the secret shown once), listed, updated, rotated and
revoked. Every change reloads the gateway's key table."""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from tokenmill.gateway.admin.common import admin_error, gateway_of, public_key
from tokenmill.gateway.key_spec import KeySpec, stored_fields
from tokenmill.gateway.keys import hash_key, new_key_id, new_secret
from tokenmill.gateway.store import keys_table
from tokenmill.gateway.store.keys_table import StoredKey

router = APIRouter()


async def _spec_of(request: Request) -> KeySpec | JSONResponse:
    try:
        raw = await request.json()
        return KeySpec.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        return admin_error(400, f"{where}: {first['msg']}", "invalid_value")
    except ValueError:
        return admin_error(400, "the body must be a JSON object", "invalid_json")


def _check_policy(gateway, spec: KeySpec) -> JSONResponse | None:
    if spec.tool_policy is not None and spec.tool_policy not in gateway.config.tool_policies:
        return admin_error(
            400, f"tool_policy: no policy named {spec.tool_policy!r}", "invalid_value"
        )
    return None


async def _existing(gateway, key_id: str) -> StoredKey | JSONResponse:
    key = await asyncio.to_thread(keys_table.get_key, gateway.db, key_id[:100])
    return key if key is not None else admin_error(404, "no such key", "key_not_found")


@router.post("/admin/keys")
async def create_key(request: Request):
    gateway = gateway_of(request)
    spec = await _spec_of(request)
    if isinstance(spec, JSONResponse):
        return spec
    if (bad := _check_policy(gateway, spec)) is not None:
        return bad
    secret, now = new_secret(), time.time()
    key = StoredKey(
        id=new_key_id(), key_hash=hash_key(secret), created=now, updated=now,
        revoked_at=None, **{"metadata": {}, **stored_fields(spec, only_set=False)},
    )  # fmt: skip
    await asyncio.to_thread(keys_table.insert_key, gateway.db, key)
    await asyncio.to_thread(gateway.keys.reload)
    return JSONResponse({"key": secret, **public_key(key)}, status_code=201)


@router.get("/admin/keys")
async def list_all(request: Request, include_revoked: bool = False):
    keys = await asyncio.to_thread(keys_table.list_keys, gateway_of(request).db, include_revoked)
    return {"object": "list", "data": [public_key(k) for k in keys]}


@router.get("/admin/keys/{key_id}")
async def get_one(key_id: str, request: Request):
    key = await _existing(gateway_of(request), key_id)
    return key if isinstance(key, JSONResponse) else public_key(key)


@router.patch("/admin/keys/{key_id}")
async def update(key_id: str, request: Request):
    gateway = gateway_of(request)
    key = await _existing(gateway, key_id)
    if isinstance(key, JSONResponse):
        return key
    spec = await _spec_of(request)
    if isinstance(spec, JSONResponse):
        return spec
    if (bad := _check_policy(gateway, spec)) is not None:
        return bad
    db = gateway.db
    await asyncio.to_thread(keys_table.update_key, db, key.id, **stored_fields(spec, only_set=True))
    await asyncio.to_thread(gateway.keys.reload)
    return public_key(await asyncio.to_thread(keys_table.get_key, db, key.id))


@router.post("/admin/keys/{key_id}/rotate")
async def rotate(key_id: str, request: Request):
    gateway = gateway_of(request)
    key = await _existing(gateway, key_id)
    if isinstance(key, JSONResponse):
        return key
    if key.revoked_at is not None:
        return admin_error(400, "a revoked key cannot be rotated", "key_revoked")
    secret = new_secret()
    db = gateway.db
    await asyncio.to_thread(keys_table.replace_hash, db, key.id, hash_key(secret))
    await asyncio.to_thread(gateway.keys.reload)
    return {
        "key": secret,
        **public_key(await asyncio.to_thread(keys_table.get_key, db, key.id)),
    }


@router.delete("/admin/keys/{key_id}")
async def revoke(key_id: str, request: Request):
    gateway = gateway_of(request)
    key = await _existing(gateway, key_id)
    if isinstance(key, JSONResponse):
        return key
    await asyncio.to_thread(keys_table.revoke_key, gateway.db, key.id, time.time())
    await asyncio.to_thread(gateway.keys.reload)
    return {"id": key.id, "object": "key", "revoked": True}
