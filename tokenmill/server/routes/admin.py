"""Operators' endpoints: the prefix cache reset (benchmarks start cold), the KV cache's
state and per-block digests, and /server_info (every setting in force, startup timings)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request

from tokenmill.openai.protocol import KVDigestsRequest
from tokenmill.server.body import parse_body
from tokenmill.server.effective_config import effective_config
from tokenmill.server.errors import APIError, bad_request
from tokenmill.server.lora import adapters as lora_adapters
from tokenmill.server.state import ServerState, engine_error, server_state

router = APIRouter()


@router.post("/reset_prefix_cache")
async def reset_prefix_cache(request: Request):
    """Admin: forget every cached prefix (all tiers). 409 while requests hold blocks."""
    if not await _utility(server_state(request), "reset_prefix_cache"):
        raise APIError(
            409,
            "prefix cache not reset: requests are running",
            "invalid_request_error",
            None,
            "busy",
        )
    return {"reset": True}


@router.get("/kv_cache")
async def kv_cache(request: Request):
    return await _utility(server_state(request), "kv_stats")


@router.post("/kv_cache/digests")
async def kv_cache_digests(request: Request):
    """SHA-256 of each full block of a prompt's KV as held here (null: not held)."""
    state = server_state(request)
    req = await parse_body(request, KVDigestsRequest, state.settings.max_body_bytes)
    if len(req.token_ids) > state.engine.max_model_len:
        raise bad_request("token_ids: longer than max_model_len", param="token_ids")
    return {"digests": await _utility(state, "kv_digests", [req.token_ids, req.cache_salt])}


@router.get("/server_info")
async def server_info(request: Request):
    state = server_state(request)
    engine = state.engine
    return {
        "model": engine.model_name,
        "max_model_len": engine.max_model_len,
        "engine": engine.engine_info,
        "speculative": engine.engine_info.get("speculative"),
        "in_flight": engine.num_in_flight,
        "lora_adapters": list(lora_adapters(engine)),  # routers key prompts by adapter
        "max_in_flight": engine.max_in_flight,
        # every setting in force (serve --config FILE included), defaults too
        "config": effective_config(getattr(engine, "config", None), state.settings),
        "kv_transfer_stats": engine.stats.kv_transfer,
        "parse_process": request.app.state.parse_process.info(),  # large bodies' parser
        "uptime_s": round(time.time() - state.started, 1),
        "startup": {
            "api": engine.profile.to_dict() if engine.profile is not None else None,
            "engine_core": engine.engine_info.get("startup"),
        },
    }


async def _utility(state: ServerState, method: str, args: list | None = None) -> Any:
    try:
        return await state.engine.call_utility(method, *(args or []))
    except RuntimeError as e:  # EngineDeadError: 503, not a hang or a 500
        raise engine_error(e, "-") from e
