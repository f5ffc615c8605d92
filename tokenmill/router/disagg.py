"""Conditional prefill/decode disaggregation (as Dynamo and llm-d decide it): per request,
whether a prefill worker computes the prompt while the decode worker pulls its KV, or the
decode worker prefills it itself.

Remote prefill pays off only when the part of the prompt the chosen decode worker does not
hold is long: a short prefill costs the decode streams less than a transfer, and a decode
worker that already holds the prefix has little to compute. A saturated prefill pool would
only add queueing, so then the decode worker prefills locally too.
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
    # benchmarks/disagg.py; below it the transfer and the second hop cost more than they save)
    min_uncached_tokens: int = 512
    max_prefill_in_flight: int = 4  # per prefill worker; beyond it the pool is saturated
    # booked prompt tokens not yet prefilled on a prefill worker beyond which it is saturated
    # too: a short prompt queued behind a long one would wait seconds for its first token
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
) -> tuple[list[Replica], str, str]:
    """The prefill workers this request may use (none: prefill locally), a reason code (a
    metric label) and the reason in words (the decision log)."""
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
    free = [
        r for r in prefill_pool
        if in_flight.get(r.name, 0) < config.max_prefill_in_flight
        and queued.get(r.name, 0.0) + uncached <= max(config.max_prefill_queue_tokens, uncached)
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
