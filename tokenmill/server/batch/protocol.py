"""The body of POST /v1/batches."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from tokenmill.server.protocol import APIModel
from tokenmill.server.responses.protocol import (
    MAX_METADATA,
    MAX_METADATA_KEY,
    MAX_METADATA_VALUE,
)


class BatchCreateRequest(APIModel):
    input_file_id: str = Field(max_length=100)
    endpoint: str = Field(max_length=100)
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = None
    # output_expires_after is accepted and ignored: output files are kept until deleted

    @field_validator("metadata")
    @classmethod
    def _check_metadata(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is None:
            return v
        if len(v) > MAX_METADATA:
            raise ValueError(f"at most {MAX_METADATA} pairs, got {len(v)}")
        for key, value in v.items():
            if not 0 < len(key) <= MAX_METADATA_KEY:
                raise ValueError(f"keys must be 1 to {MAX_METADATA_KEY} characters")
            if len(value) > MAX_METADATA_VALUE:
                raise ValueError(f"values must be at most {MAX_METADATA_VALUE} characters")
        return v
