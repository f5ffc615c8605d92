"""The JSON the UI polls, under /ui/api (behind the API key or the gateway like every data
path): what this process is, its sampled series, and (router) the replicas and decisions.
add_ui_routes puts a UIData in app.state.ui and includes the routers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI, Query, Request

from tokenmill.ui.sampler import Sampler

router = APIRouter(include_in_schema=False)
details_router = APIRouter(include_in_schema=False)  # the router's replicas and decisions


@dataclass
class UIData:
    sampler: Sampler
    info: Callable[[], dict[str, Any]]
    details: Callable[[], dict[str, Any]] | None = None


def add_ui_routes(
    app: FastAPI,
    sampler: Sampler,
    info: Callable[[], dict[str, Any]],
    details: Callable[[], dict[str, Any]] | None = None,
) -> None:
    app.state.ui = UIData(sampler, info, details)
    app.include_router(router)
    if details is not None:
        app.include_router(details_router)


def _ui(request: Request) -> UIData:
    return request.app.state.ui


@router.get("/ui/api/info")
async def ui_info(request: Request):
    """`admin`: the caller holds the gateway's admin key (the page then shows the keys,
    spend and audit logs, which only that key may read)."""
    gateway = getattr(request.app.state, "gateway", None)
    admin = False
    if gateway is not None:
        from tokenmill.gateway.admin import is_admin

        admin = is_admin(gateway, request.headers.get("authorization", "").encode("latin-1"))
    return {**_ui(request).info(), "gateway": gateway is not None, "admin": admin}


@router.get("/ui/api/series")
async def ui_series(request: Request, since: float | None = Query(None, ge=0, le=1e11)):
    sampler = _ui(request).sampler
    c = sampler.config
    return {
        "interval_s": c.interval_s,
        "rate_s": c.rate_s,
        "window_s": c.window_s,
        "keep_s": c.keep_s,
        "samples": sampler.since(since),
    }


@details_router.get("/ui/api/details")
async def ui_details(request: Request):
    return _ui(request).details()
