"""The JSON the UI polls, under /ui/api (behind the API key or the gateway like every data
path): what this process is, its sampled series, and (router) the replicas and decisions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Query, Request

from tokenmill.ui.sampler import Sampler


def add_ui_routes(
    app: FastAPI,
    sampler: Sampler,
    info: Callable[[], dict[str, Any]],
    details: Callable[[], dict[str, Any]] | None = None,
) -> None:
    @app.get("/ui/api/info", include_in_schema=False)
    async def ui_info(request: Request):
        """`admin`: the caller holds the gateway's admin key (the page then shows the keys,
        spend and audit logs, which only that key may read)."""
        gateway = getattr(app.state, "gateway", None)
        admin = False
        if gateway is not None:
            from tokenmill.gateway.admin import is_admin

            admin = is_admin(gateway, request.headers.get("authorization", "").encode("latin-1"))
        return {**info(), "gateway": gateway is not None, "admin": admin}

    @app.get("/ui/api/series", include_in_schema=False)
    async def ui_series(since: float | None = Query(None, ge=0, le=1e11)):
        c = sampler.config
        return {
            "interval_s": c.interval_s,
            "rate_s": c.rate_s,
            "window_s": c.window_s,
            "keep_s": c.keep_s,
            "samples": sampler.since(since),
        }

    if details is not None:

        @app.get("/ui/api/details", include_in_schema=False)
        async def ui_details():
            return details()
