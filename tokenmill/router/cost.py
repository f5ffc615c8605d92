"""Dynamo-style cost of sending one request to one replica, in blocks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenmill.router.config import CostWeights
from tokenmill.router.index import DEVICE, DISK, HOST


@dataclass(frozen=True)
class Candidate:
    """One replica's view of a request: its cache hit and its load, and the cost."""

    replica: str
    prompt_blocks: float  # prompt tokens / block size
    hit_blocks: int  # leading blocks it holds, any tier
    credited_blocks: float  # the hit weighted by tier
    pending_prefill: float  # booked prefill blocks not yet done
    active_blocks: int  # distinct blocks of requests in flight, this one included
    in_flight: int
    cost: float

    @property
    def new_prefill(self) -> float:
        return max(0.0, self.prompt_blocks - self.credited_blocks)

    def brief(self) -> dict:
        return {
            "replica": self.replica,
            "hit": self.hit_blocks,
            "credit": round(self.credited_blocks, 2),
            "new_prefill": round(self.new_prefill, 2),
            "pending": round(self.pending_prefill, 2),
            "active": self.active_blocks,
            "in_flight": self.in_flight,
            "cost": round(self.cost, 2),
        }


def tier_credit(bits: int, w: CostWeights) -> float:
    if bits & DEVICE:
        return w.device_credit
    if bits & HOST:
        return w.host_credit
    if bits & DISK:
        return w.disk_credit
    return 0.0


def overlap(
    tiers: Sequence[int], approx_prefix: int, max_blocks: int, w: CostWeights
) -> tuple[int, float]:
    """(leading blocks held, credited blocks): the event index's tiers, with the blocks the
    approximate index vouches for counted as device; at most `max_blocks` (the engine always
    computes the prompt's last token, so a hit never covers the whole prompt)."""
    n, credit = 0, 0.0
    while n < max_blocks:
        bits = tiers[n] if n < len(tiers) else 0
        if n < approx_prefix:
            bits |= DEVICE
        if not bits:
            break
        credit += tier_credit(bits, w)
        n += 1
    return n, credit


def candidate(
    replica: str,
    num_tokens: int,
    block_size: int,
    tiers: Sequence[int],
    approx_prefix: int,
    pending_prefill: float,
    active_blocks: int,
    in_flight: int,
    w: CostWeights,
) -> Candidate:
    prompt_blocks = num_tokens / block_size
    hit, credit = overlap(tiers, approx_prefix, max(0, num_tokens - 1) // block_size, w)
    new_prefill = max(0.0, prompt_blocks - credit)
    cost = w.prefill * (pending_prefill + new_prefill) + w.decode * active_blocks
    return Candidate(
        replica, prompt_blocks, hit, credit, pending_prefill, active_blocks, in_flight, cost
    )
