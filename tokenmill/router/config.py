"""Frozen router settings: policy, cost weights, imbalance guard, timeouts, limits."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenmill.router.disagg import DisaggConfig

POLICIES = ("cache_aware", "least_load", "round_robin", "session")


@dataclass(frozen=True)
class CostWeights:
    """cost = prefill · (pending prefill blocks + new prefill blocks) + decode · active blocks.

    A cached block is credited against the prefill by its tier: device 1.0, host 0.75 (a
    copy back), disk 0.25 (a read and a copy back). Dynamo uses decode 1.0 on GPUs, where a
    decode step's time grows with the KV it reads; on a CPU replica a decode step costs
    about the same at batch 1 or 8 while a cold prefill is the expensive part, so the
    default weighs active blocks at 0.1.
    """

    prefill: float = 1.0
    decode: float = 0.1
    device_credit: float = 1.0
    host_credit: float = 0.75
    disk_credit: float = 0.25

    def __post_init__(self) -> None:
        for name in ("prefill", "decode", "device_credit", "host_credit", "disk_credit"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0")


@dataclass(frozen=True)
class GuardConfig:
    """SGLang's imbalance guard, on requests in flight per replica: when max − min > abs and
    max > rel · min, the request goes to the least-loaded replica instead."""

    abs_threshold: int = 64
    rel_threshold: float = 1.5


@dataclass(frozen=True)
class RouterConfig:
    policy: str = "cache_aware"
    weights: CostWeights = field(default_factory=CostWeights)
    guard: GuardConfig = field(default_factory=GuardConfig)
    booking_ttl_s: float = 30.0  # a booked prefill counts as pending load at most this long
    approx_ttl_s: float = 120.0  # decision-made index entries, replicas without (full) events
    confirm_ttl_s: float = 10.0  # decision-made entries while a replica's events confirm them
    health_interval_s: float = 1.0
    unhealthy_after: int = 2  # failed health checks in a row
    retries: int = 1  # before the first token, on another replica
    max_in_flight: int = 512  # proxied at once; more wait in the router's queue
    max_queue: int = 512  # waiting beyond this: 503
    queue_timeout_s: float = 30.0
    connect_timeout_s: float = 3.0
    read_timeout_s: float = 600.0  # between two bytes from a replica
    replay_timeout_s: float = 2.0
    max_body_bytes: int = 4 * 1024 * 1024
    prompt_threads: int = 2  # render, tokenize and hash prompts off the event loop
    disagg: DisaggConfig = field(default_factory=DisaggConfig)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy: must be one of {', '.join(POLICIES)}")
        if self.retries < 0:
            raise ValueError("retries: must be >= 0")
        if self.max_in_flight < 1 or self.max_queue < 0:
            raise ValueError("max_in_flight: must be >= 1 (max_queue >= 0)")
        if self.prompt_threads < 1:
            raise ValueError("prompt_threads: must be >= 1")
