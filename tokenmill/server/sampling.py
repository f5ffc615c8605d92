"""A request's SamplingParams with this server's limits: each request model builds its own
(to_sampling_params on ChatCompletionRequest, CompletionRequest, ResponsesRequest; batch
lines run through chat's and completions'); a value the engine refuses is a 400 naming it."""

from __future__ import annotations

from typing import Protocol

from tokenmill.sampling_params import SamplingParams
from tokenmill.server.errors import from_value_error
from tokenmill.server.state import ServerState
from tokenmill.structured.spec import StructuredOutputsParams


class SamplingRequest(Protocol):
    def to_sampling_params(
        self,
        prompt_len: int,
        max_model_len: int,
        default_max_tokens: int,
        structured_outputs: StructuredOutputsParams | None = None,
    ) -> SamplingParams: ...


def sampling_params(
    state: ServerState,
    req: SamplingRequest,
    prompt_len: int,
    structured_outputs: StructuredOutputsParams | None = None,
) -> SamplingParams:
    """`req.to_sampling_params` against the model's context and the server's default
    max_tokens; `structured_outputs` is the request's constraint, already checked."""
    try:
        return req.to_sampling_params(
            prompt_len,
            state.engine.max_model_len,
            state.settings.default_max_tokens,
            structured_outputs,
        )
    except ValueError as e:
        raise from_value_error(e) from e
