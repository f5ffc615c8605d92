"""Operators' endpoints: the router's view of its replicas, and a prefix cache reset on
every healthy replica (benchmarks start cold)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from tokenmill.router.routes import front

router = APIRouter()


@router.get("/router_info")
async def router_info(request: Request):
    f = front(request)
    return {
        **f.router.snapshot(),
        "in_flight": f.admission.in_flight,
        "queued": f.admission.waiting,
    }


@router.post("/reset_prefix_cache")
async def reset_prefix_cache(request: Request):
    """Admin: resets every healthy replica's prefix cache (benchmarks start cold)."""
    return await front(request).reset_prefix_caches(request)
