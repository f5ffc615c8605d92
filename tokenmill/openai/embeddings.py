"""POST /v1/embeddings: OpenAI's request body and response object (and vLLM's pooling
extension fields)."""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field

from tokenmill.openai.protocol import INT32_MAX, APIModel, TokenIds

# OpenAI's limit on the inputs of one call
MAX_EMBEDDING_INPUTS = 2048


class EmbeddingRequest(APIModel):
    model: str | None = None
    # emptiness and the number of inputs are checked by the server: a 400 naming them
    input: (
        str
        | TokenIds
        | Annotated[list[str], Field(fail_fast=True)]
        | Annotated[list[TokenIds], Field(fail_fast=True)]
    )
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, le=INT32_MAX)
    user: str | None = None
    # vLLM's extension: False returns the raw pooled state (default: the model's own pooling)
    normalize: bool | None = None


def encode_vector(vector: list[float], encoding_format: str) -> list[float] | str:
    """float: the numbers; base64: little-endian float32 bytes, as OpenAI sends them."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
    return vector


def embedding_response(
    vectors: list[list[float] | str], model: str, prompt_tokens: int
) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
