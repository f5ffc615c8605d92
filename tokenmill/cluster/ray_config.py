"""How workers are placed on a Ray cluster (frozen; validated on construction)."""

from __future__ import annotations

from dataclasses import dataclass

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
AUTO = "auto"  # `--ray auto`: a local head, started and stopped with the cluster


@dataclass(frozen=True)
class RayConfig:
    address: str = AUTO  # or a running cluster's: `HOST:6379`, `ray://HOST:10001`
    strategy: str = "SPREAD"  # the placement group's, over the bundles started together
    memory_gb: float = 2.0  # Ray's `memory` resource per worker (scheduling, not a limit)
    gpus: float | None = None  # per worker; None: 1 when the cluster has GPUs, else 0
    max_restarts: int = 5  # Ray restarts a failed worker this often (-1: without end)
    placement_timeout_s: float = 120.0  # resources must be found within this
    head_cpus: int | None = None  # `auto`: the local head's CPUs (default: all)
    namespace: str = "tokenmill"

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"ray strategy: {self.strategy!r} is not one of {STRATEGIES}")
        if self.memory_gb < 0:
            raise ValueError("ray memory: must be >= 0")
        if self.gpus is not None and self.gpus < 0:
            raise ValueError("ray gpus: must be >= 0")
        if self.max_restarts < -1:
            raise ValueError("ray max restarts: must be >= -1")
        if self.placement_timeout_s <= 0:
            raise ValueError("ray placement timeout: must be > 0")
        if not self.address:
            raise ValueError("ray address: empty (use 'auto' for a local head)")
