"""What a workload is: sessions of one or more turns, ready to send."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from tokenmill.bench.lengths import LengthDist

WorkloadKind = Literal["random", "shared-prefix", "multi-turn", "jsonl", "trace"]
T = TypeVar("T")


@dataclass(frozen=True)
class Turn:
    """One request: the new user text, its token count, and the output tokens to ask for.

    `context` holds chat messages that come before `text` (a JSONL conversation); in a
    multi-turn session earlier turns and the replies received are added at send time.
    """

    text: str
    input_tokens: int
    output_tokens: int
    context: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Session:
    id: int
    turns: tuple[Turn, ...]
    group: int | None = None  # shared-prefix group
    arrival_s: float | None = None  # trace replay: planned send time


@dataclass(frozen=True)
class Workload:
    name: str
    sessions: tuple[Session, ...]
    prompt_kind: str  # random-token-ids | random-words | file
    description: str = ""

    @property
    def num_requests(self) -> int:
        return sum(len(s.turns) for s in self.sessions)


@dataclass(frozen=True)
class WorkloadSpec:
    kind: WorkloadKind = "random"
    num_requests: int = 100
    input_len: LengthDist = field(default_factory=lambda: LengthDist("fixed", 128))
    output_len: LengthDist = field(default_factory=lambda: LengthDist("fixed", 128))
    num_groups: int = 8
    prompts_per_group: int = 8
    prefix_len: int = 1000
    suffix_len: int = 32
    turns: int = 3
    path: str | None = None
    trace_time_unit: Literal["s", "ms"] = "s"
    trace_speedup: float = 1.0

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise ValueError("num_requests: must be >= 1")
        if self.kind in ("jsonl", "trace") and not self.path:
            raise ValueError(f"dataset: the {self.kind} workload needs --dataset FILE")
        if self.turns < 1 or self.num_groups < 1 or self.prompts_per_group < 1:
            raise ValueError("turns, num_groups and prompts_per_group: must be >= 1")

    def describe(self) -> str:
        if self.kind == "shared-prefix":
            return (
                f"shared-prefix {self.num_groups}x{self.prompts_per_group}, prefix "
                f"{self.prefix_len} + suffix {self.suffix_len}, out {self.output_len}"
            )
        if self.kind == "multi-turn":
            return f"multi-turn {self.turns} turns, in {self.input_len}, out {self.output_len}"
        if self.kind in ("jsonl", "trace"):
            return f"{self.kind} {self.path}"
        return f"random in {self.input_len}, out {self.output_len}"


def sub_rng(seed: int, *keys: int) -> random.Random:
    """An independent, reproducible generator per item (order of async calls doesn't matter)."""
    return random.Random(hash((seed, *keys)) & 0xFFFFFFFF)


async def gather_limited(factories: list[Callable[[], Awaitable[T]]], limit: int = 8) -> list[T]:
    sem = asyncio.Semaphore(limit)

    async def one(f: Callable[[], Awaitable[T]]) -> T:
        async with sem:
            return await f()

    return list(await asyncio.gather(*(one(f) for f in factories)))
