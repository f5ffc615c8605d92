"""Token-length distributions: `128`, `uniform:64-256`, `normal:128,32`."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class LengthDist:
    """fixed (a), uniform integers in [a, b], or normal (mean a, std b) rounded; all ≥ 1."""

    kind: Literal["fixed", "uniform", "normal"]
    a: float
    b: float = 0.0

    def __post_init__(self) -> None:
        if self.a < 1 and self.kind != "normal":
            raise ValueError(f"length: {self.a} must be >= 1")
        if self.kind == "uniform" and self.b < self.a:
            raise ValueError(f"length: uniform range {self.a}-{self.b} is empty")
        if self.kind == "normal" and self.b < 0:
            raise ValueError("length: normal std must be >= 0")

    def sample(self, rng: random.Random, n: int) -> list[int]:
        if self.kind == "fixed":
            return [int(self.a)] * n
        if self.kind == "uniform":
            return [rng.randint(int(self.a), int(self.b)) for _ in range(n)]
        return [max(1, round(rng.gauss(self.a, self.b))) for _ in range(n)]

    @property
    def mean(self) -> float:
        return (self.a + self.b) / 2 if self.kind == "uniform" else self.a

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"{int(self.a)}"
        if self.kind == "uniform":
            return f"uniform:{int(self.a)}-{int(self.b)}"
        return f"normal:{self.a:g},{self.b:g}"

    @classmethod
    def parse(cls, text: str | int) -> LengthDist:
        s = str(text).strip().lower()
        kind, sep, rest = s.partition(":")
        try:
            if not sep:
                return cls("fixed", int(s))
            if kind == "uniform":
                lo, _, hi = rest.replace(",", "-").partition("-")
                return cls("uniform", int(lo), int(hi))
            if kind == "normal":
                mean, _, std = rest.partition(",")
                return cls("normal", float(mean), float(std or 0))
        except ValueError as e:
            if "length:" in str(e):
                raise
        raise ValueError(f"length: bad spec {text!r} (use 128, uniform:64-256, normal:128,32)")
