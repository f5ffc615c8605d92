"""What a pooling (embedding) request asks for instead of tokens: vLLM's PoolingParams."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

POOLING_TYPES = ("LAST", "MEAN", "CLS")


@dataclass(frozen=True)
class PoolingParams:
    """The request's prompt runs once and its hidden states are pooled into one vector:
    the last token's (decoder models), the mean over every token, or the first (CLS)."""

    pooling_type: str | None = None  # None: the model's own (its sentence-transformers config)
    # L2-normalised; None: as the model's own pooling (sentence-transformers' Normalize module;
    # decoder models and folders without modules.json: yes, as OpenAI's embeddings are)
    normalize: bool | None = None
    dimensions: int | None = None  # Matryoshka: the first n values (normalised after the cut)

    def __post_init__(self) -> None:
        if self.pooling_type is not None and self.pooling_type not in POOLING_TYPES:
            raise ValueError(f"pooling_type: must be one of {POOLING_TYPES}")
        if self.dimensions is not None and self.dimensions < 1:
            raise ValueError("dimensions: must be at least 1")

    @property
    def needs_all_tokens(self) -> bool:
        """Every prompt position is computed (no prefix-cache reads): mean and CLS pooling,
        and a model's default that may be either."""
        return self.pooling_type != "LAST"

    def to_wire(self) -> list[Any]:
        return [self.pooling_type, self.normalize, self.dimensions]

    @classmethod
    def from_wire(cls, values: list[Any]) -> PoolingParams:
        return cls(*values)
