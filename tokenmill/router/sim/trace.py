"""A synthetic chat trace: users in multi-turn conversations on a few system-prompt families.

Sessions start as a Poisson process whose rate scales with the replica count (each replica
sees the same load); each picks a family (Zipf popularity; the family's system prompt opens
every turn's prompt) and a number of turns. Turn k's prompt is turn k-1's prompt, its reply
and a new user message, so a conversation's prefix grows. A row holds lengths only; token
ids come from (seed, session, turn), so a JSONL file of rows replays exactly.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class TraceConfig:
    replicas: int = 16
    duration_s: float = 90.0  # the trace's window: no request is planned after it
    session_rate: float = 0.25  # sessions per second per replica
    families_per_replica: float = 0.5  # system-prompt families, at least min_families
    min_families: int = 4
    family_skew: float = 1.0  # Zipf exponent of family popularity
    system_tokens: tuple[int, int] = (600, 1400)
    mean_turns: float = 4.0  # geometric, capped at max_turns
    max_turns: int = 8
    user_tokens: tuple[int, int] = (30, 300)
    output_tokens: tuple[int, int] = (30, 200)
    think_s: float = 10.0  # mean gap between two turns of a session
    vocab: int = 49152
    seed: int = 0

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.duration_s <= 0 or self.session_rate <= 0:
            raise ValueError("replicas, duration_s and session_rate: must be positive")
        if self.mean_turns < 1 or self.max_turns < 1:
            raise ValueError("mean_turns and max_turns: must be >= 1")

    @property
    def num_families(self) -> int:
        return max(self.min_families, round(self.families_per_replica * self.replicas))


@dataclass(frozen=True)
class TraceRequest:
    t: float  # planned arrival (seconds); a turn never goes out before the previous reply
    session: int
    turn: int
    family: int
    user_tokens: int
    output_tokens: int

    @property
    def request_id(self) -> str:
        return f"s{self.session}-t{self.turn}"


@dataclass(frozen=True)
class Trace:
    seed: int
    vocab: int
    system_tokens: tuple[int, ...]  # per family
    requests: tuple[TraceRequest, ...]  # by t

    def save(self, path: str | Path) -> None:
        with open(path, "w") as f:
            head = {"seed": self.seed, "vocab": self.vocab, "system_tokens": self.system_tokens}
            f.write(json.dumps(head) + "\n")
            for r in self.requests:
                f.write(json.dumps(asdict(r)) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """A trace `save` wrote; ValueError naming the line if it is not one."""
        line_no = 1
        try:
            with open(path) as f:
                head = json.loads(f.readline())
                trace = cls(head["seed"], head["vocab"], tuple(head["system_tokens"]), ())
                rows = []
                for line_no, line in enumerate(f, start=2):  # noqa: B007 (read on error)
                    if line.strip():
                        rows.append(TraceRequest(**json.loads(line)))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{line_no}: not a router_sim trace ({e!r})") from None
        rows.sort(key=lambda r: (r.t, r.session, r.turn))
        return replace(trace, requests=tuple(rows))


def generate(config: TraceConfig) -> Trace:
    rng = random.Random(config.seed)
    families = config.num_families
    system = tuple(rng.randint(*config.system_tokens) for _ in range(families))
    weights = [1 / (i + 1) ** config.family_skew for i in range(families)]
    stop = 1 / config.mean_turns  # geometric: P(another turn) = 1 - stop
    rate = config.session_rate * config.replicas
    rows: list[TraceRequest] = []
    t, session = 0.0, 0
    while True:
        t += rng.expovariate(rate)
        if t >= config.duration_s:
            break
        family = rng.choices(range(families), weights)[0]
        turns = 1
        while turns < config.max_turns and rng.random() > stop:
            turns += 1
        at = t
        for turn in range(turns):
            user = rng.randint(*config.user_tokens)
            out = rng.randint(*config.output_tokens)
            if at < config.duration_s:
                rows.append(TraceRequest(round(at, 6), session, turn, family, user, out))
            at += rng.expovariate(1 / config.think_s)
        session += 1
    rows.sort(key=lambda r: (r.t, r.session, r.turn))
    return Trace(config.seed, config.vocab, system, tuple(rows))


def mean_prompt_tokens(trace: Trace) -> float:
    """Average prompt length over the trace's requests (system prompt + history + message)."""
    history: dict[int, int] = {}
    total = 0
    for r in sorted(trace.requests, key=lambda r: (r.session, r.turn)):
        prev = history.get(r.session, trace.system_tokens[r.family])
        total += prev + r.user_tokens
        history[r.session] = prev + r.user_tokens + r.output_tokens
    return total / max(1, len(trace.requests))
