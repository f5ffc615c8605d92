"""tokenmill: an LLM inference platform (engine, OpenAI-compatible server, router, tools).

The offline API is imported on first use, so that processes which only serve HTTP (the
API process, the router) do not load the engine with the package."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tokenmill.version import __version__

__all__ = [
    "LLM",
    "SamplingParams",
    "RequestOutput",
    "CompletionOutput",
    "Logprob",
    "RequestOutputKind",
    "PoolingParams",
    "EmbeddingRequestOutput",
    "LoRARequest",
    "__version__",
]

_LAZY = {
    "LLM": "tokenmill.engine.llm",
    "SamplingParams": "tokenmill.sampling_params",
    "RequestOutputKind": "tokenmill.sampling_params",
    "RequestOutput": "tokenmill.outputs",
    "CompletionOutput": "tokenmill.outputs",
    "Logprob": "tokenmill.outputs",
    "EmbeddingRequestOutput": "tokenmill.outputs",
    "PoolingParams": "tokenmill.pooling_params",
    "LoRARequest": "tokenmill.lora_request",
}

if TYPE_CHECKING:
    from tokenmill.engine.llm import LLM
    from tokenmill.lora_request import LoRARequest
    from tokenmill.outputs import CompletionOutput, EmbeddingRequestOutput, Logprob, RequestOutput
    from tokenmill.pooling_params import PoolingParams
    from tokenmill.sampling_params import RequestOutputKind, SamplingParams


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tokenmill' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
