"""Messages between the engine core (scheduler + model) and its front end."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenmill.sampling_params import SamplingParams

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

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class SpecDecodeStats:
    """Speculative decoding counters since start (vLLM's spec_decode_* series)."""

    num_drafts: int = 0  # verification steps of a request with drafts
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # accepted_per_pos[i]: drafts accepted at position i; accepted_lengths[a]: steps with a
    accepted_per_pos: list[int] = field(default_factory=list)
    accepted_lengths: list[int] = field(default_factory=list)
    # by the proposer that drafted them (a draft head's steps: "draft_head" or its "ngram" lookup)
    draft_tokens_by_proposer: dict[str, int] = field(default_factory=dict)
    accepted_tokens_by_proposer: dict[str, int] = field(default_factory=dict)

    def record(self, drafted: int, accepted: int, proposer: str = "") -> None:
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        if proposer:
            by = self.draft_tokens_by_proposer
            by[proposer] = by.get(proposer, 0) + drafted
            by = self.accepted_tokens_by_proposer
            by[proposer] = by.get(proposer, 0) + accepted
        for counts, upto in (
            (self.accepted_per_pos, drafted),
            (self.accepted_lengths, drafted + 1),
        ):
            if len(counts) < upto:
                counts.extend([0] * (upto - len(counts)))
        for i in range(accepted):
            self.accepted_per_pos[i] += 1
        self.accepted_lengths[accepted] += 1

    def copy(self) -> SpecDecodeStats:
        return SpecDecodeStats(
            self.num_drafts,
            self.num_draft_tokens,
            self.num_accepted_tokens,
            list(self.accepted_per_pos),
            list(self.accepted_lengths),
            dict(self.draft_tokens_by_proposer),
            dict(self.accepted_tokens_by_proposer),
        )

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verification step: accepted drafts + the target's own token."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


@dataclass
class SchedulerStats:
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    num_preemptions: int = 0
    num_repetition_cutoffs: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    # per tier ("device"/"host"/"disk"): prefix hit tokens and tier counters
    prefix_cache_hits_by_medium: dict = field(default_factory=dict)
    kv_tiers: dict = field(default_factory=dict)
    spec_decode: SpecDecodeStats | None = None  # None: speculation off
    kv_transfer: dict | None = None  # KVTransferStats.to_dict(); None: no connector


@dataclass
class EngineCoreOutputs:
    outputs: list[EngineCoreOutput] = field(default_factory=list)
    stats: SchedulerStats = field(default_factory=SchedulerStats)
