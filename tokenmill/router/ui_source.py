"""The router's dashboard series: its Prometheus registry (RouterMetrics) for counters and
latencies, its own snapshot for what each replica holds right now."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tokenmill.router.router import Router
from tokenmill.ui.rates import per_second, per_second_by, ratio, window_percentiles
from tokenmill.ui.readings import Reading
from tokenmill.ui.recent import recent_percentiles
from tokenmill.ui.sampler import Base

P = "tokenmill:router_"


class RouterSource:
    def __init__(self, router: Router, queued: Callable[[], int]) -> None:
        self.router = router
        self.queued = queued

    def read(self) -> Reading:
        return Reading.of(self.router.metrics.registry)

    def sample(self, now: Reading, rate: Base | None, window: Base | None) -> dict[str, Any]:
        replicas = {
            r["name"]: {
                "healthy": r["healthy"],
                "in_flight": r["in_flight"],
                "index_blocks": r["index_blocks"],
            }
            for r in self.router.snapshot()["replicas"]
        }
        return {
            "replicas": replicas,
            "queued": self.queued(),
            "decisions_ps": per_second_by(now, rate, P + "decisions_total", "reason"),
            "requests_ps": per_second(now, rate, P + "requests_total"),
            "predicted_hit_rate": ratio(
                now, window, P + "hit_blocks_total", P + "prompt_blocks_total"
            ),
            "ttft_ms": recent_percentiles(self.router.metrics.recent_ttft, window),
            "decision_ms": window_percentiles(now, window, P + "decision_seconds"),
        }
