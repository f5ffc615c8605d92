"""Frozen specs of one benchmark: where to send (Target), how fast (LoadSpec), SLOs."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

LoadKind = Literal["concurrency", "constant", "poisson", "throughput", "trace"]
Endpoint = Literal["chat", "completions"]


@dataclass(frozen=True)
class Target:
    """One OpenAI-compatible server under test."""

    name: str
    base_url: str
    model: str | None = None  # model id to send; None: first id from /v1/models
    endpoint: Endpoint = "completions"
    api_key: str | None = None
    ignore_eos: bool = True  # also sends min_tokens = max_tokens
    request_timeout_s: float = 600.0

    @property
    def url(self) -> str:
        path = "chat/completions" if self.endpoint == "chat" else "completions"
        return f"{self.base_url.rstrip('/')}/v1/{path}"


@dataclass(frozen=True)
class LoadSpec:
    """How requests are released.

    concurrency: `concurrency` closed-loop workers, each sends its next request when the
    previous one ends. constant / poisson: open loop at `rate` req/s (poisson: gamma
    inter-arrivals, shape = burstiness, mean 1/rate), each request fired at its planned time
    whatever the responses do; `max_concurrency` optionally caps requests in flight (the
    wait is recorded as schedule delay). throughput: everything at t=0. trace: arrival times
    from the workload.
    """

    kind: LoadKind
    concurrency: int | None = None
    rate: float | None = None
    burstiness: float = 1.0
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.kind == "concurrency" and (self.concurrency is None or self.concurrency < 1):
            raise ValueError("concurrency: must be >= 1 for a concurrency load")
        if self.kind in ("constant", "poisson") and not (self.rate and self.rate > 0):
            raise ValueError("rate: must be > 0 for a rate load")
        if self.burstiness <= 0:
            raise ValueError("burstiness: must be > 0")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError("max_concurrency: must be >= 1")

    @property
    def label(self) -> str:
        cap = f" cap {self.max_concurrency}" if self.max_concurrency else ""
        if self.kind == "concurrency":
            return f"c={self.concurrency}"
        if self.kind == "constant":
            return f"{self.rate:g} req/s constant{cap}"
        if self.kind == "poisson":
            b = f" b={self.burstiness:g}" if self.burstiness != 1.0 else ""
            return f"{self.rate:g} req/s poisson{b}{cap}"
        return f"{self.kind}{cap}"

    @property
    def nominal_concurrency(self) -> float:
        if self.kind == "concurrency":
            return float(self.concurrency or 1)
        return float(self.max_concurrency) if self.max_concurrency else math.nan


_SLO_KEYS = {
    "ttft": "ttft_ms",
    "tpot": "tpot_ms",
    "itl": "itl_ms",
    "e2el": "e2e_ms",
    "e2e": "e2e_ms",
}


@dataclass(frozen=True)
class SLO:
    """Service-level objectives in ms; a request meets the SLO when it meets every one set."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    itl_ms: float | None = None  # applied to the request's max token gap
    e2e_ms: float | None = None

    @property
    def empty(self) -> bool:
        return all(v is None for v in (self.ttft_ms, self.tpot_ms, self.itl_ms, self.e2e_ms))

    @classmethod
    def parse(cls, text: str | None) -> SLO:
        """`ttft=500ms,tpot=50ms,e2el=10s` (bare numbers are ms, as vLLM's --goodput)."""
        if not text:
            return cls()
        values: dict[str, float] = {}
        for part in re.split(r"[,\s]+", text.strip()):
            if not part:
                continue
            key, sep, raw = part.partition("=")
            if not sep:
                key, sep, raw = part.partition(":")
            field = _SLO_KEYS.get(key.strip().lower())
            if field is None or not sep:
                raise ValueError(f"slo: bad entry {part!r} (use ttft=500ms,tpot=50ms,e2el=2s)")
            values[field] = parse_duration_ms(raw)
        return cls(**values)


def parse_duration_ms(raw: str) -> float:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*", raw)
    if not m:
        raise ValueError(f"slo: bad duration {raw!r}")
    value = float(m.group(1))
    return value * 1000.0 if m.group(2) == "s" else value
