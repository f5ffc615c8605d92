"""The generation endpoints, each request to the replica the routing policy picks."""

from __future__ import annotations

from fastapi import APIRouter, Request

from tokenmill.router.routes import front

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat(request: Request):
    return await front(request).routed(request, "/v1/chat/completions", "chat")


@router.post("/v1/completions")
async def completions(request: Request):
    return await front(request).routed(request, "/v1/completions", "completions")
