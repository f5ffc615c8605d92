"""A request as the engine core sees it: tokens, progress, status."""

from __future__ import annotations

import enum
import time

import torch

from tokenmill.pooling_params import PoolingParams
from tokenmill.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5
    FINISHED_ERROR = 6

    @property
    def finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED


FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


class Request:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_ids: list[int],
        max_model_len: int,
        arrival_time: float | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        pooling_params: PoolingParams | None = None,
        lora_name: str | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.arrival_time = arrival_time if arrival_time is not None else time.monotonic()
        self.priority = priority
        self.cache_salt = cache_salt
        self.lora_name = lora_name  # the LoRA adapter it runs with (None: the base model)
        self.lora_id: int | None = None  # the adapter's number in KV events (vLLM's lora_id)
        # a pooling (embedding) request: its prompt runs once, pooled instead of sampled
        self.pooling_params = pooling_params
        self.pooled_parts: dict[int, torch.Tensor] = {}  # chunk start -> pooled sum (MEAN)
        self.skip_reading_prefix_cache = (
            pooling_params is not None and pooling_params.needs_all_tokens
        )
        self.block_hashes: list[bytes] = []  # chained hashes of full blocks, filled lazily
        self.status = RequestStatus.WAITING
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache at first schedule
        self.num_preemptions = 0
        self.stop_reason: int | str | None = None
        self.first_scheduled_time: float | None = None

        params = sampling_params
        remaining = max_model_len - len(prompt_token_ids)
        self.max_tokens = (
            min(params.max_tokens, remaining) if params.max_tokens is not None else remaining
        )
        self.eos_token_ids = [] if params.ignore_eos else list(eos_token_ids)
        self.stop_token_ids = set(params.stop_token_ids or []) | set(self.eos_token_ids)
        self.grammar = None  # llguidance.LLMatcher when the output is constrained
        self.repetition = None  # RepetitionDetector when loop cut-off is on
        self.banned_next: list[int] = []  # tokens banned at the next step (loop breaking)
        self.loop_breaks = 0
        # Constrained output heading for its end: sampling prefers tokens that close it.
        self.closing = False
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            self.generator = torch.Generator()
            self.generator.manual_seed(params.seed)
        # Prompt positions whose next-token logprob was already delivered (each is sent once,
        # even when preemption recomputes the prompt).
        last = max(len(prompt_token_ids) - 1, 0)
        self.prompt_logprobs_upto = 0 if params.prompt_logprobs is not None else last

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)

    def sort_key(self, policy: str) -> tuple:
        if policy == "priority":
            return (self.priority, self.arrival_time)
        return (self.arrival_time,)
