"""Endpoints any healthy replica answers the same: the models, the tokenizer."""

from __future__ import annotations

from fastapi import APIRouter, Request

from tokenmill.router.routes import front

router = APIRouter()


@router.get("/v1/models")
async def models(request: Request):
    return await front(request).passthrough(request, "/v1/models")


@router.get("/v1/models/{model_id}")
async def model(request: Request, model_id: str):
    return await front(request).passthrough(request, f"/v1/models/{model_id}")


@router.post("/tokenize")
async def tokenize(request: Request):
    return await front(request).passthrough(request, "/tokenize")


@router.post("/detokenize")
async def detokenize(request: Request):
    return await front(request).passthrough(request, "/detokenize")
