"""tokenmill: an LLM inference platform (engine, OpenAI-compatible server, router, tools)."""

from tokenmill.engine.llm import LLM
from tokenmill.outputs import CompletionOutput, Logprob, RequestOutput
from tokenmill.sampling_params import RequestOutputKind, SamplingParams

__version__ = "0.1.0"
__all__ = [
    "LLM",
    "SamplingParams",
    "RequestOutput",
    "CompletionOutput",
    "Logprob",
    "RequestOutputKind",
    "__version__",
]
