"""POST /v1/embeddings (serving_embedding.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from tokenmill.openai.embeddings import EmbeddingRequest
from tokenmill.server.body import parse_body
from tokenmill.server.serving_embedding import create_embedding
from tokenmill.server.state import server_state

router = APIRouter()
REQUEST_BODIES = {"/v1/embeddings": EmbeddingRequest}


@router.post("/v1/embeddings")
async def embeddings(request: Request):
    state = server_state(request)
    req = await parse_body(request, EmbeddingRequest, state.settings.max_body_bytes)
    return await create_embedding(state, req, request, request.state.request_id)
