"""The router's own liveness and metrics: healthy while any replica is."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from tokenmill.router.routes import front
from tokenmill.server.errors import error_body
from tokenmill.version import __version__

router = APIRouter()


@router.get("/version")
async def version():
    return {"version": __version__, "role": "router"}


@router.get("/health")
async def health(request: Request):
    if front(request).router.healthy():
        return Response(status_code=200)
    return JSONResponse(
        error_body("no healthy replica", "server_error", code="no_healthy_replica"),
        status_code=503,
    )


@router.get("/metrics")
async def metrics(request: Request):
    f = front(request)
    f.router.metrics.queued.set(f.admission.waiting)
    return Response(
        f.router.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
    )
