"""What an engine does with pooling (embedding) requests: the model's own pooling fills in
what a request leaves open; a request the model cannot serve is refused by name."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from tokenmill.config import EngineConfig
from tokenmill.model.pooling_config import read_pooling_config
from tokenmill.pooling_params import PoolingParams


@dataclass(frozen=True)
class ModelPooling:
    default_type: str  # the model's pooling: its sentence-transformers config, else LAST/CLS
    default_normalize: bool  # its config's Normalize module (no config: normalised)
    hidden_size: int  # the most `dimensions` a request may ask for
    encoder_only: bool  # an encoder (BERT) serves pooling requests and nothing else

    @classmethod
    def for_model(cls, path: Path, hidden_size: int, encoder_only: bool) -> ModelPooling:
        fallback = "CLS" if encoder_only else "LAST"  # vLLM's defaults for the two kinds
        config = read_pooling_config(path, fallback)
        return cls(config.pooling_type, config.normalize, hidden_size, encoder_only)

    def resolve(self, params: PoolingParams | None) -> PoolingParams | None:
        """The request's pooling with the model's defaults in; ValueError naming the field
        when the model cannot serve it."""
        if params is None:
            if self.encoder_only:
                raise ValueError(
                    "model: this is an encoder (embedding) model; it serves /v1/embeddings only"
                )
            return None
        if params.dimensions is not None and params.dimensions > self.hidden_size:
            raise ValueError(
                f"dimensions: {params.dimensions} is more than this model's {self.hidden_size}"
            )
        return dataclasses.replace(
            params,
            pooling_type=params.pooling_type or self.default_type,
            normalize=self.default_normalize if params.normalize is None else params.normalize,
        )

    def to_info(self) -> dict:
        return dataclasses.asdict(self)


def encoder_engine_config(config: EngineConfig, model_len: int) -> EngineConfig:
    """An encoder sees each prompt whole, in one step (its attention is bidirectional, over
    no KV cache): no chunked prefill, a token budget that holds the longest prompt, and no
    prefix cache (its blocks hold no KV)."""
    sched = config.scheduler_config
    budget = max(sched.max_num_batched_tokens, model_len)
    return dataclasses.replace(
        config,
        scheduler_config=dataclasses.replace(
            sched, enable_chunked_prefill=False, max_num_batched_tokens=budget
        ),
        cache_config=dataclasses.replace(config.cache_config, enable_prefix_caching=False),
    )
