"""Liveness and monitoring: /health (load balancers' probes), /version, /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from tokenmill.server.errors import error_body
from tokenmill.server.state import server_state
from tokenmill.version import __version__

router = APIRouter()


@router.api_route("/health", methods=["GET", "HEAD"])  # HEAD: load balancers' probes
async def health(request: Request):
    state = server_state(request)
    engine = state.engine
    if state.draining:
        return JSONResponse(
            error_body("shutting down", "server_error", code="draining"), status_code=503
        )
    if not engine.healthy:
        return JSONResponse(
            error_body(
                engine.dead_reason or "engine core down", "server_error", code="engine_dead"
            ),
            status_code=503,
        )
    return Response(status_code=200)


@router.get("/version")
async def version():
    return {"version": __version__}


@router.get("/metrics")
async def metrics_endpoint(request: Request):
    metrics = server_state(request).metrics
    return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
