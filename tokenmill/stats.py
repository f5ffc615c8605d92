"""What the engine core counts: scheduler and speculative-decoding statistics, sent to the
front end with every step's outputs (neutral types)."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    # tokens routed to each expert since start, [MoE layer][expert]; None: a dense model
    expert_load: list | None = None
