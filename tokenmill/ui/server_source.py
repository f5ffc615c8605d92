"""The engine server's dashboard series, read from its Prometheus registry (ServerMetrics)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from tokenmill.ui.rates import per_second, ratio, window_percentiles
from tokenmill.ui.readings import Reading
from tokenmill.ui.recent import RecentValues, recent_percentiles
from tokenmill.ui.sampler import Base

P = "tokenmill:"


class ServerSource:
    def __init__(
        self, registry: CollectorRegistry, recent_ttft: RecentValues | None = None
    ) -> None:
        """TTFT percentiles come from `recent_ttft` (default: the registry's, a
        ServerRegistry's), exact; from the histogram's buckets only without one."""
        self.registry = registry
        self.recent_ttft = (
            recent_ttft if recent_ttft is not None else getattr(registry, "recent_ttft", None)
        )

    def read(self) -> Reading:
        return Reading.of(self.registry)

    def sample(self, now: Reading, rate: Base | None, window: Base | None) -> dict[str, Any]:
        kv = {"device": round(now.total(P + "kv_cache_usage_perc"), 4)}
        for medium, used in now.by(P + "kv_tier_usage_perc", "medium").items():
            kv[medium] = round(used, 4)
        return {
            "running": now.total(P + "num_requests_running"),
            "waiting": now.total(P + "num_requests_waiting"),
            "kv_usage": kv,
            "prefix_hit_rate": ratio(
                now, window, P + "prefix_cache_hits_total", P + "prefix_cache_queries_total"
            ),
            "output_tps": per_second(now, rate, P + "generation_tokens_total"),
            "prompt_tps": per_second(now, rate, P + "prompt_tokens_total"),
            "finished_ps": per_second(now, rate, P + "request_success_total"),
            "preemptions_ps": per_second(now, rate, P + "num_preemptions_total"),
            "loop_cutoffs_ps": per_second(now, rate, P + "repetition_cutoffs_total"),
            "ttft_ms": self._ttft_ms(now, window),
            "itl_ms": window_percentiles(now, window, P + "inter_token_latency_seconds"),
            "totals": {
                "generation_tokens": now.total(P + "generation_tokens_total"),
                "requests": now.total(P + "request_success_total"),
                "preemptions": now.total(P + "num_preemptions_total"),
                "loop_cutoffs": now.total(P + "repetition_cutoffs_total"),
            },
        }

    def _ttft_ms(self, now: Reading, window: Base | None) -> dict[str, float] | None:
        if self.recent_ttft is not None:
            return recent_percentiles(self.recent_ttft, window)
        return window_percentiles(now, window, P + "time_to_first_token_seconds")
