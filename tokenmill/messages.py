"""Messages between the engine core (scheduler + model) and its front end: requests in,
outputs and stats out (neutral types: they import nothing of the engine)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenmill.pooling_params import PoolingParams
from tokenmill.sampling_params import SamplingParams
from tokenmill.stats import SchedulerStats

# One position's logprobs: (token ids, logprobs, rank of the first id). The first id is the
# token actually there (sampled or prompt); the rest are the top-k alternatives.
PositionLogprobs = tuple[list[int], list[float], int]


@dataclass
class EngineCoreRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float
    priority: int = 0
    cache_salt: str | None = None
    kv_transfer_params: dict | None = None  # KVTransferParams.to_json()
    pooling_params: PoolingParams | None = None  # an embedding request
    lora_name: str | None = None  # the LoRA adapter to run with (None: the base model)


@dataclass
class EngineCoreOutput:
    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[PositionLogprobs] | None = None
    # prompt positions 1..n-1 (position 0 has none), delivered once
    prompt_logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    # monotonic clock (system-wide) when the request was first scheduled; for queue-time metrics
    first_scheduled_time: float | None = None
    pooled: list[float] | None = None  # a pooling request's vector (it finishes with it)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class EngineCoreOutputs:
    outputs: list[EngineCoreOutput] = field(default_factory=list)
    stats: SchedulerStats = field(default_factory=SchedulerStats)
