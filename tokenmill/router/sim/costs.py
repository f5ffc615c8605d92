"""The step-time model of a simulated replica, from measured costs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CostModel:
    """step time = overhead + prefill tokens · prefill cost + decoding sequences · decode cost.

    Defaults: benchmarks/results/2026-12-01-throughput-xeon.md, tokenmill native (Q4_1 weights) on
    SmolLM2-135M, 2 threads of this machine's Xeon: prefill 956 tok/s at 512 tokens
    (1.046 ms/token), single-stream decode 232 tok/s (4.31 ms per step), decode at 64
    sequences 332 tok/s (193 ms per step). The two decode points give 3.0 ms per sequence
    plus 1.3 ms per step. Attention's growth with context length is not modelled.
    """

    step_overhead_s: float = 0.0013
    prefill_s_per_token: float = 0.001046
    decode_s_per_seq: float = 0.0030

    def __post_init__(self) -> None:
        for name in ("step_overhead_s", "prefill_s_per_token", "decode_s_per_seq"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0")

    def step_time(self, prefill_tokens: int, decode_seqs: int) -> float:
        return (
            self.step_overhead_s
            + prefill_tokens * self.prefill_s_per_token
            + decode_seqs * self.decode_s_per_seq
        )

    def describe(self) -> str:
        return (
            f"step = {self.step_overhead_s * 1e3:.2f} ms + "
            f"{self.prefill_s_per_token * 1e3:.3f} ms x prefill tokens + "
            f"{self.decode_s_per_seq * 1e3:.2f} ms x decoding sequences"
        )
