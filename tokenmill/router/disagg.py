"""Conditional prefill/decode disaggregation (as Dynamo and llm-d decide it): per request,
whether a prefill worker computes the prompt while the decode worker pulls its KV, or the
decode worker prefills it itself.

Remote prefill pays off only when the part of the prompt the chosen decode worker does not
hold is more than a few blocks: a tiny prefill costs the decode streams little, and a decode
worker that already holds the prefix has little to compute. A saturated prefill pool would
only add queueing, so then the decode worker prefills locally too. Prefill workers share
their steps between prompts (`--long-prefill-token-threshold`), so a short prompt waits for
about its own length of each prompt ahead, not for a long one's whole prefill.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from tokenmill.router.load import Booking
from tokenmill.router.replicas import Replica

DISAGG_MODES = ("conditional", "always", "never")


@dataclass(frozen=True)
class DisaggConfig:
    mode: str = "conditional"
    # uncached prompt tokens from which a prefill worker computes the prompt (measured:
    # benchmarks/disagg.py; on a CPU a local 128-token prefill stalls every stream of the
    # decode worker ~12 decode steps, moving its blocks costs ~5 ms)
    min_uncached_tokens: int = 64
    max_prefill_in_flight: int = 16  # per prefill worker; beyond it the pool is saturated
    # prefill work a prompt may wait for (this minus its own length, or as long as its local
    # prefill would stall the decode worker's streams) before a prefill worker counts as
    # saturated: booked prompt tokens not yet prefilled, each counted up to the prompt's own
    # length on a worker that shares its steps between prompts (long_prefill_token_threshold)
    max_prefill_queue_tokens: int = 4096

    def __post_init__(self) -> None:
        if self.mode not in DISAGG_MODES:
            raise ValueError(f"pd_mode: must be one of {', '.join(DISAGG_MODES)}")
        if (self.min_uncached_tokens < 0 or self.max_prefill_in_flight < 1
                or self.max_prefill_queue_tokens < 0):  # fmt: skip
            raise ValueError(
                "pd thresholds: min_uncached_tokens >= 0, max_prefill_in_flight >= 1, "
                "max_prefill_queue_tokens >= 0"
            )


@dataclass
class DisaggDecision:
    remote: bool
    reason: str
    uncached_tokens: int
    prefill: Replica | None = None
    booking: Booking | None = None
    transfer_id: str = ""

    def brief(self) -> dict:
        out: dict = {"remote": self.remote, "reason": self.reason,
                     "uncached_tokens": self.uncached_tokens}  # fmt: skip
        if self.prefill is not None:
            out["prefill"] = self.prefill.name
            out["transfer_id"] = self.transfer_id
        return out


def new_transfer_id() -> str:
    return "kvt-" + uuid.uuid4().hex


def eligible_prefill(
    config: DisaggConfig,
    uncached: int,
    num_seqs: int,
    prefill_pool: list[Replica],
    in_flight: dict[str, int],
    queued_tokens: dict[str, float] | None = None,
    decode_streams: int = 0,
) -> tuple[list[Replica], str, str]:
    """The prefill workers this request may use (none: prefill locally), a reason code (a
    metric label) and the reason in words (the decision log). `decode_streams`: the other
    requests on the decode worker, which a local prefill would stall."""
    if config.mode == "never":
        return [], "off", "disaggregation off"
    if not prefill_pool:
        return [], "no_prefill_worker", "no healthy prefill worker"
    if num_seqs != 1:
        return [], "several_sequences", "n > 1 or several prompts"
    threshold = config.min_uncached_tokens
    if config.mode == "conditional" and uncached < threshold:
        return [], "short", f"uncached {uncached} < {threshold} tokens"
    queued = queued_tokens or {}
    # a prompt may wait for max_prefill_queue_tokens minus its own length, or for as long as
    # a local prefill would stall the decode worker's streams: its own length for each
    may_wait = max(config.max_prefill_queue_tokens - uncached, uncached * max(1, decode_streams))
    free = [
        r for r in prefill_pool
        if in_flight.get(r.name, 0) < config.max_prefill_in_flight
        and queued.get(r.name, 0.0) <= may_wait
    ]  # fmt: skip
    if not free:
        return (
            [],
            "saturated",
            "every prefill worker is at max_prefill_in_flight requests or max_prefill_queue_tokens",
        )
    if config.mode == "always":
        return free, "always", "disaggregation always on"
    return free, "long", f"uncached {uncached} >= {threshold} tokens"
