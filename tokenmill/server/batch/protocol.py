"""The body of POST /v1/batches."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tokenmill.openai.protocol import APIModel
from tokenmill.openai.responses_protocol import Metadata


class BatchCreateRequest(APIModel):
    input_file_id: str = Field(max_length=100)
    endpoint: str = Field(max_length=100)
    completion_window: Literal["24h"]
    metadata: Metadata | None = None
    # output_expires_after is accepted and ignored: output files are kept until deleted
