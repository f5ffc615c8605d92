"""Prometheus series of a worker's KV transfers (prefill/decode disaggregation), from the
cumulative `KVTransferStats` the engine core reports."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class KVTransferMetrics:
    def __init__(self, registry: CollectorRegistry, model: str) -> None:
        self.model = model
        labels = ["model_name", "direction"]
        self.transfers = Counter(
            "tokenmill:kv_transfers", "Completed KV transfers (sent: confirmed by the puller)",
            labels, registry=registry,
        )  # fmt: skip
        self.blocks = Counter(
            "tokenmill:kv_transfer_blocks", "KV blocks transferred", labels, registry=registry
        )
        self.bytes = Counter(
            "tokenmill:kv_transfer_bytes", "KV bytes transferred", labels, registry=registry
        )
        self.seconds = Counter(
            "tokenmill:kv_transfer_receive_seconds",
            "Time from a transfer's first pull to its last block, summed",
            ["model_name"], registry=registry,
        )  # fmt: skip
        self.failures = Counter(
            "tokenmill:kv_transfer_failures", "Failed KV loads by reason",
            ["model_name", "reason"], registry=registry,
        )  # fmt: skip
        self.fallbacks = Counter(
            "tokenmill:kv_transfer_fallbacks", "Failed KV loads recomputed locally",
            ["model_name"], registry=registry,
        )  # fmt: skip
        self.lease_expiries = Counter(
            "tokenmill:kv_transfer_lease_expiries", "Leases ended by their timeout",
            ["model_name"], registry=registry,
        )  # fmt: skip
        self.dropped = Counter(
            "tokenmill:kv_transfer_dropped", "Served transfers whose request was aborted, "
            "failed or preempted", ["model_name"], registry=registry,
        )  # fmt: skip

    def update(self, now: dict, before: dict | None) -> None:
        before = before or {}
        m = self.model

        def delta(key: str) -> float:
            return now.get(key, 0) - before.get(key, 0)

        for direction, count, blocks, nbytes in (
            ("sent", "transfers_served", "blocks_sent", "bytes_sent"),
            ("received", "transfers_received", "blocks_received", "bytes_received"),
        ):
            for counter, key in ((self.transfers, count), (self.blocks, blocks),
                                 (self.bytes, nbytes)):  # fmt: skip
                if delta(key) > 0:
                    counter.labels(m, direction).inc(delta(key))
        for counter, key in (
            (self.seconds, "receive_seconds"),
            (self.fallbacks, "fallbacks"),
            (self.lease_expiries, "leases_expired"),
            (self.dropped, "transfers_dropped"),
        ):
            if delta(key) > 0:
                counter.labels(m).inc(delta(key))
        old = before.get("failures", {})
        for reason, n in now.get("failures", {}).items():
            if n > old.get(reason, 0):
                self.failures.labels(m, reason).inc(n - old.get(reason, 0))
