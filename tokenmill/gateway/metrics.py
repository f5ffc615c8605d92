"""The gateway's Prometheus metrics (`tokenmill:gateway_...`), in the registry of the app it
fronts (the server's or the router's), so /metrics shows them with the rest."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None, pending: Callable[[], int]) -> None:
        r = registry or CollectorRegistry()
        p = "tokenmill:gateway_"
        self.requests = Counter(
            p + "requests_total",
            "generation requests by admission outcome",
            ["outcome"],
            registry=r,
        )
        self.unauthorized = Counter(
            p + "unauthorized_total", "requests refused for their key", ["reason"], registry=r
        )
        self.guardrail = Counter(
            p + "guardrail_decisions_total", "guardrail rule matches by action",
            ["rule", "stage", "action"], registry=r,
        )  # fmt: skip
        self.tool_calls = Counter(
            p + "tool_calls_total", "proposed tool calls by policy verdict", ["verdict"], registry=r
        )
        self.spend = Counter(
            p + "spend_usd_total", "cost of the metered requests (USD)", registry=r
        )
        self.ledger_pending = Gauge(
            p + "ledger_pending_rows", "ledger rows journaled, not yet in the database", registry=r
        )
        self.ledger_pending.set_function(pending)
        self.admission_seconds = Histogram(
            p + "admission_seconds",
            "gateway time before a request reaches the model (key, limits, input guardrails)",
            buckets=(0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1, 1.0),
            registry=r,
        )
        self.config_reloads = Counter(
            p + "config_reloads_total", "config file reloads", ["result"], registry=r
        )
