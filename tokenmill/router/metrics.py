"""Prometheus metrics of the router (`tokenmill:router_...`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from tokenmill.router.index import MEDIUM_BITS
from tokenmill.ui.recent import RecentValues

_SECONDS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
_TTFT = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)


class RouterMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        p = "tokenmill:router_"
        self.decisions = Counter(
            p + "decisions_total", "routing decisions", ["policy", "replica", "reason"], registry=r
        )
        self.hit_blocks = Counter(
            p + "hit_blocks_total", "predicted cached prompt blocks of routed requests",
            ["replica"], registry=r,
        )  # fmt: skip
        self.prompt_blocks = Counter(
            p + "prompt_blocks_total", "full prompt blocks of routed requests", registry=r
        )
        self.guard_triggers = Counter(
            p + "imbalance_guard_total", "decisions taken by the imbalance guard", registry=r
        )
        self.requests = Counter(
            p + "requests_total", "proxied requests by outcome", ["replica", "outcome"], registry=r
        )
        self.retries = Counter(
            p + "retries_total", "requests retried on another replica", ["reason"], registry=r
        )
        self.stream_errors = Counter(
            p + "stream_errors_total", "streams ended by an upstream failure", ["replica"],
            registry=r,
        )  # fmt: skip
        self.rejected = Counter(
            p + "rejected_total", "requests refused by the router", ["reason"], registry=r
        )
        self.client_gone = Counter(
            p + "client_disconnects_total",
            "requests whose client left before the reply (cancelled at the replica)", registry=r,
        )  # fmt: skip
        self.cached_tokens = Counter(
            p + "cached_tokens_total", "prompt tokens the replicas reported cached", ["replica"],
            registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            p + "prompt_tokens_total", "prompt tokens the replicas reported", ["replica"],
            registry=r,
        )  # fmt: skip
        self._event_metrics(r, p)
        self.decision_seconds = Histogram(
            p + "decision_seconds", "tokenize + hash + score + book", buckets=_SECONDS, registry=r
        )
        self.ttft = Histogram(
            p + "time_to_first_token_seconds", "router-side TTFT of streamed requests",
            buckets=_TTFT, registry=r,
        )  # fmt: skip
        self.healthy = Gauge(p + "replica_healthy", "1 when healthy", ["replica"], registry=r)
        self.in_flight = Gauge(p + "in_flight", "requests in flight", ["replica"], registry=r)
        self.queued = Gauge(p + "queued", "requests waiting in the router's queue", registry=r)
        self.pending_prefill = Gauge(
            p + "pending_prefill_blocks", "booked prefill blocks", ["replica"], registry=r
        )
        self.index_blocks = Gauge(
            p + "index_blocks", "blocks the index holds for a replica", ["replica", "medium"],
            registry=r,
        )  # fmt: skip
        self.events_synced = Gauge(
            p + "kv_events_synced", "1 when the event index is complete, 0 when partial/none",
            ["replica"], registry=r,
        )  # fmt: skip
        self._transfer_metrics(r, p)
        self.recent_ttft = RecentValues()  # exact, for the dashboard's percentiles
        self._collect: Callable[[RouterMetrics], None] | None = None
        # the stream-side counters the subscribers keep, last seen
        self._seen: dict[tuple[str, str], int] = {}

    def _event_metrics(self, r: CollectorRegistry, p: str) -> None:
        """The replicas' KV event streams and their health."""
        self.event_batches = Counter(
            p + "kv_event_batches_total", "KV event batches applied", ["replica"], registry=r
        )
        self.event_gaps = Counter(
            p + "kv_event_gaps_total", "sequence gaps in KV event streams", ["replica"],
            registry=r,
        )  # fmt: skip
        self.event_resyncs = Counter(
            p + "kv_event_resyncs_total", "full resyncs of a replica's index", ["replica"],
            registry=r,
        )  # fmt: skip
        self.event_bad_batches = Counter(
            p + "kv_event_bad_batches_total", "malformed KV event messages (replayed as gaps)",
            ["replica"], registry=r,
        )  # fmt: skip
        self.event_errors = Counter(
            p + "kv_event_subscriber_errors_total",
            "event subscriber failures (each: purge, backoff, full resync)", ["replica"],
            registry=r,
        )  # fmt: skip
        self.health_changes = Counter(
            p + "replica_health_changes_total", "replica health transitions", ["replica", "to"],
            registry=r,
        )  # fmt: skip

    def _transfer_metrics(self, r: CollectorRegistry, p: str) -> None:
        """Prefill/decode disaggregation: the router's decisions, the workers' transfers."""
        self.kv_transfer_decisions = Counter(
            p + "kv_transfer_decisions_total",
            "prefill/decode disaggregation decisions: remote prefill or local, by reason",
            ["decision", "reason"], registry=r,
        )  # fmt: skip
        self.kv_transfer_prefill_errors = Counter(
            p + "kv_transfer_prefill_errors_total",
            "remote prefill requests that failed at the prefill worker (the decode worker "
            "recomputes)", ["replica"], registry=r,
        )  # fmt: skip
        # each worker's own KV transfer counters (from its /server_info), summed by replica
        worker = {
            "transfers_served": "transfers confirmed by the decode worker (prefill side)",
            "transfers_received": "transfers loaded (decode side)",
            "bytes_sent": "KV bytes sent (prefill side)",
            "bytes_received": "KV bytes received (decode side)",
            "fallbacks": "failed KV loads recomputed by the decode worker",
            "failures": "failed KV loads, any reason (decode side)",
            "leases_expired": "leases ended by their timeout (prefill side)",
        }
        self.kv_transfer_worker = {
            key: Counter(p + f"kv_transfer_{key}_total", text, ["replica"], registry=r)
            for key, text in worker.items()
        }

    def observe_ttft(self, seconds: float) -> None:
        self.ttft.observe(seconds)
        self.recent_ttft.add(seconds)

    def forget_replica(self, replica: str) -> None:
        """A replica left: its gauges' series go (a gone replica is not "healthy" nor "0 in
        flight"); its counters stay, and one that rejoins under the same address counts its
        new process's totals from zero."""
        series = [(g, (replica,)) for g in (self.healthy, self.in_flight, self.pending_prefill,
                                            self.events_synced)]  # fmt: skip
        series += [(self.index_blocks, (replica, medium)) for medium in MEDIUM_BITS]
        for gauge, labels in series:
            with contextlib.suppress(KeyError):  # never set (older prometheus_client raise)
                gauge.remove(*labels)
        for seen in [k for k in self._seen if k[0] == replica]:
            del self._seen[seen]

    def on_collect(self, fn: Callable[[RouterMetrics], None]) -> None:
        self._collect = fn

    def add_delta(self, counter: Counter, replica: str, key: str, total: int) -> None:
        """Advances a counter to a running total kept elsewhere."""
        prev = self._seen.get((replica, key), 0)
        if total > prev:
            counter.labels(replica).inc(total - prev)
        self._seen[(replica, key)] = total

    def kv_transfer_from(self, replica: str, stats: dict) -> None:
        for key, counter in self.kv_transfer_worker.items():
            value = stats.get(key, 0)
            if isinstance(value, dict):
                value = sum(v for v in value.values() if isinstance(v, int | float))
            if isinstance(value, int | float):
                self.add_delta(counter, replica, "kv_" + key, int(value))

    def render(self) -> bytes:
        if self._collect is not None:
            self._collect(self)
        return generate_latest(self.registry)
