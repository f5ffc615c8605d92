"""The latency/throughput trade-off of measured configurations: the Pareto frontier of
per-user output tok/s (what one user feels) against total output tok/s (what the server
delivers), and the pick: the most total throughput among the configurations that meet the
SLO."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    key: str  # the configuration's id
    per_user: float  # output tok/s per user
    total: float  # output tok/s of the server
    slo_attainment: float | None = None  # fraction of requests meeting every objective
    clean: bool = True  # measured on an otherwise idle machine

    def dominates(self, other: Point) -> bool:
        return (
            self.per_user >= other.per_user
            and self.total >= other.total
            and (self.per_user > other.per_user or self.total > other.total)
        )


def pareto_frontier(points: Sequence[Point]) -> list[Point]:
    """The points no other point dominates, by ascending per-user throughput (ties on both
    axes keep one)."""
    ordered = sorted(points, key=lambda p: (-p.per_user, -p.total, p.key))
    frontier: list[Point] = []
    best_total = float("-inf")
    for p in ordered:  # decreasing per-user: kept when it adds total throughput
        if p.total > best_total:
            frontier.append(p)
            best_total = p.total
    return frontier[::-1]


def meets(point: Point, attainment: float) -> bool:
    """No SLO given (attainment None) counts as met."""
    return point.slo_attainment is None or point.slo_attainment >= attainment


def pick(points: Sequence[Point], attainment: float = 0.9) -> Point | None:
    """The configuration to serve with: the most total throughput among those meeting the
    SLO on a clean measurement (ties: more per-user throughput); None when none does."""
    eligible = [p for p in points if p.clean and meets(p, attainment)]
    if not eligible:
        return None
    return max(eligible, key=lambda p: (p.total, p.per_user, p.key))
