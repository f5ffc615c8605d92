"""Routing policies over scored candidates: cache_aware (minimum cost, with SGLang's
imbalance guard), least_load, round_robin and session (sticky by a session key)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from tokenmill.router.config import GuardConfig
from tokenmill.router.cost import Candidate


def imbalanced(cands: Sequence[Candidate], guard: GuardConfig) -> bool:
    """max − min requests in flight > abs and max > rel · min."""
    if len(cands) < 2:
        return False
    loads = [c.in_flight for c in cands]
    hi, lo = max(loads), min(loads)
    return hi - lo > guard.abs_threshold and hi > guard.rel_threshold * lo


def _rotated(cands: Sequence[Candidate], start: int) -> list[tuple[int, Candidate]]:
    """Candidates with a tie-break rank that rotates, so equal ones take turns."""
    n = len(cands)
    return [((i - start) % n, c) for i, c in enumerate(cands)]


def least_loaded(cands: Sequence[Candidate], start: int = 0) -> Candidate:
    return min(
        _rotated(cands, start),
        key=lambda rc: (rc[1].in_flight, rc[1].pending_prefill, rc[1].active_blocks, rc[0]),
    )[1]


def min_cost(cands: Sequence[Candidate], start: int = 0) -> Candidate:
    return min(_rotated(cands, start), key=lambda rc: (rc[1].cost, rc[1].in_flight, rc[0]))[1]


def rendezvous(key: str, cands: Sequence[Candidate]) -> Candidate:
    """Highest-random-weight choice: a replica leaving moves only its own sessions."""

    def weight(c: Candidate) -> bytes:
        return hashlib.sha256(f"{key}\x00{c.replica}".encode()).digest()

    return max(cands, key=weight)


def choose(
    policy: str,
    cands: Sequence[Candidate],
    guard: GuardConfig,
    turn: int,
    session: str | None = None,
) -> tuple[Candidate, str]:
    """(candidate, reason). `turn` rotates ties and drives round robin."""
    if not cands:
        raise ValueError("no candidates")
    if policy == "round_robin":
        return cands[turn % len(cands)], "round_robin"
    if policy == "least_load":
        return least_loaded(cands, turn), "least_load"
    if policy == "session":
        if session:
            return rendezvous(session, cands), "session"
        return least_loaded(cands, turn), "session_fallback"
    if imbalanced(cands, guard):
        return least_loaded(cands, turn), "imbalance_guard"
    best = min_cost(cands, turn)
    top_credit = max(c.credited_blocks for c in cands)
    if best.credited_blocks > 0 and best.credited_blocks >= top_credit:
        return best, "cache_hit"
    return best, "load"
