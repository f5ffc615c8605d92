"""Prometheus metrics, named after vLLM's (prefix `tokenmill:`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from tokenmill.config import MAX_SPEC_ROWS
from tokenmill.engine.async_llm import RequestTiming
from tokenmill.server.kv_transfer_metrics import KVTransferMetrics
from tokenmill.stats import SchedulerStats, SpecDecodeStats
from tokenmill.ui.recent import RecentValues

_LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_ITL_BUCKETS = (
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
)


class ServerRegistry(CollectorRegistry):
    """The server's Prometheus registry, which also holds the exact TTFTs of recent requests
    (the dashboard's percentiles: ui/server_source.py reads both from it)."""

    def __init__(self) -> None:
        super().__init__()
        self.recent_ttft = RecentValues()


class ServerMetrics:
    """Implements the engine's StatsObserver and exposes everything on /metrics."""

    def __init__(self, model_name: str) -> None:
        self.registry = ServerRegistry()
        self.kv_transfer: KVTransferMetrics | None = None  # created by a worker's first stats
        labels = ["model_name"]
        r = self.registry
        self._request_metrics(r, labels)
        self._spec_metrics(r, labels)
        self._tier_metrics(r, labels)
        self.expert_tokens = Counter(
            "tokenmill:moe_expert_tokens",
            "Tokens routed to each expert of a mixture-of-experts layer",
            [*labels, "layer", "expert"],
            registry=r,
        )
        self.expert_imbalance = Gauge(
            "tokenmill:moe_expert_load_imbalance",
            "Busiest expert's tokens over the mean of its MoE layer since start (1 = even)",
            [*labels, "layer"],
            registry=r,
        )
        self.weights_kld = Gauge(
            "tokenmill:weights_kld",
            "Mean KL divergence of the served weights from float32 (measured at load by "
            "--max-kld on the built-in text)",
            [*labels, "plan"],
            registry=r,
        )
        self.model = model_name
        self._last = SchedulerStats()
        # Expose every model-level series from the start (zero until something happens).
        for metric in (
            self.running, self.waiting, self.kv_usage, self.preemptions, self.prefix_queries, self.prefix_hits,
            self.prompt_tokens, self.generation_tokens, self.ttft, self.itl, self.e2e, self.queue_time,
            self.repetition_cutoffs,
        ):  # fmt: skip
            metric.labels(model_name)

    def _request_metrics(self, r: CollectorRegistry, labels: list[str]) -> None:
        """Requests, tokens and latencies (vLLM's names)."""
        self.running = Gauge(
            "tokenmill:num_requests_running", "Sequences running in the engine", labels, registry=r
        )
        self.waiting = Gauge(
            "tokenmill:num_requests_waiting",
            "Sequences waiting to be scheduled",
            labels,
            registry=r,
        )
        self.kv_usage = Gauge(
            "tokenmill:kv_cache_usage_perc",
            "Fraction of KV cache blocks in use (0-1)",
            labels,
            registry=r,
        )
        self.preemptions = Counter(
            "tokenmill:num_preemptions", "Preemptions (recompute)", labels, registry=r
        )
        self.prefix_queries = Counter(
            "tokenmill:prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache",
            labels,
            registry=r,
        )
        self.prefix_hits = Counter(
            "tokenmill:prefix_cache_hits",
            "Prompt tokens found in the prefix cache",
            labels,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "tokenmill:prompt_tokens", "Prompt tokens processed", labels, registry=r
        )
        self.generation_tokens = Counter(
            "tokenmill:generation_tokens", "Tokens generated", labels, registry=r
        )
        self.request_success = Counter(
            "tokenmill:request_success",
            "Finished requests by finish reason",
            [*labels, "finished_reason"],
            registry=r,
        )
        self.ttft = Histogram(
            "tokenmill:time_to_first_token_seconds",
            "Time to first token",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "tokenmill:inter_token_latency_seconds",
            "Time between tokens",
            labels,
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "tokenmill:e2e_request_latency_seconds",
            "Request latency",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "tokenmill:request_queue_time_seconds",
            "Time waiting before first scheduled",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.repetition_cutoffs = Counter(
            "tokenmill:repetition_cutoffs",
            "Sequences ended by the loop cut-off",
            labels,
            registry=r,
        )

    def _spec_metrics(self, r: CollectorRegistry, labels: list[str]) -> None:
        """Speculative decoding (vLLM's spec_decode_* names)."""
        self.spec_drafts = Counter(
            "tokenmill:spec_decode_num_drafts",
            "Verification steps of a request with drafted tokens",
            labels,
            registry=r,
        )
        self.spec_draft_tokens = Counter(
            "tokenmill:spec_decode_num_draft_tokens", "Drafted tokens", labels, registry=r
        )
        self.spec_accepted_tokens = Counter(
            "tokenmill:spec_decode_num_accepted_tokens",
            "Accepted drafted tokens",
            labels,
            registry=r,
        )
        self.spec_accepted_per_pos = Counter(
            "tokenmill:spec_decode_num_accepted_tokens_per_pos",
            "Accepted drafted tokens by draft position (0: first draft)",
            [*labels, "position"],
            registry=r,
        )
        by_proposer = [*labels, "proposer"]
        self.spec_draft_tokens_by_proposer = Counter(
            "tokenmill:spec_decode_num_draft_tokens_by_proposer",
            "Drafted tokens by proposer (a draft head's: draft_head, or the ngram lookup it tries "
            "first)",
            by_proposer,
            registry=r,
        )
        self.spec_accepted_tokens_by_proposer = Counter(
            "tokenmill:spec_decode_num_accepted_tokens_by_proposer",
            "Accepted drafted tokens by proposer",
            by_proposer,
            registry=r,
        )
        self.spec_acceptance_length = Histogram(
            "tokenmill:spec_decode_acceptance_length",
            "Tokens per verification step (accepted drafts + the target's own token)",
            labels,
            buckets=list(range(1, MAX_SPEC_ROWS + 1)),
            registry=r,
        )

    def _tier_metrics(self, r: CollectorRegistry, labels: list[str]) -> None:
        """KV tiers and where prefix hits came from."""
        tier = [*labels, "medium"]
        self.tier_hits = Counter(
            "tokenmill:kv_tier_hits", "Blocks loaded back from a lower KV tier", tier, registry=r
        )
        self.tier_stores = Counter(
            "tokenmill:kv_tier_stores", "Blocks written down to a KV tier", tier, registry=r
        )
        self.tier_evictions = Counter(
            "tokenmill:kv_tier_evictions", "Blocks evicted from a KV tier", tier, registry=r
        )
        self.tier_corrupted = Counter(
            "tokenmill:kv_tier_corrupted",
            "Disk blocks that failed their checksum",
            tier,
            registry=r,
        )
        self.tier_bytes_stored = Counter(
            "tokenmill:kv_tier_stored_bytes", "Bytes written to a KV tier", tier, registry=r
        )
        self.tier_bytes_loaded = Counter(
            "tokenmill:kv_tier_loaded_bytes", "Bytes loaded from a KV tier", tier, registry=r
        )
        self.tier_usage = Gauge(
            "tokenmill:kv_tier_usage_perc",
            "Fraction of a lower KV tier's capacity in use (0-1)",
            tier,
            registry=r,
        )
        self.tier_load_p50 = Gauge(
            "tokenmill:kv_tier_load_seconds_p50", "Median block load latency", tier, registry=r
        )
        self.tier_store_p50 = Gauge(
            "tokenmill:kv_tier_store_seconds_p50", "Median block store latency", tier, registry=r
        )
        self.prefix_hits_by_medium = Counter(
            "tokenmill:prefix_cache_hits_by_medium",
            "Prompt tokens found cached, by tier",
            tier,
            registry=r,
        )

    def set_weights_kld(self, report: dict | None) -> None:
        if report:
            self.weights_kld.labels(self.model, report["plan"]).set(report["mean_kld"])

    def on_scheduler_stats(self, stats: SchedulerStats) -> None:
        m = self.model
        self.running.labels(m).set(stats.num_running_reqs)
        self.waiting.labels(m).set(stats.num_waiting_reqs)
        self.kv_usage.labels(m).set(stats.kv_cache_usage)
        for counter, now, before in (
            (self.preemptions, stats.num_preemptions, self._last.num_preemptions),
            (self.prefix_queries, stats.prefix_cache_queries, self._last.prefix_cache_queries),
            (self.prefix_hits, stats.prefix_cache_hits, self._last.prefix_cache_hits),
            (
                self.repetition_cutoffs,
                stats.num_repetition_cutoffs,
                self._last.num_repetition_cutoffs,
            ),
        ):
            if now > before:
                counter.labels(m).inc(now - before)
        for medium, tokens in stats.prefix_cache_hits_by_medium.items():
            before = self._last.prefix_cache_hits_by_medium.get(medium, 0)
            if tokens > before:
                self.prefix_hits_by_medium.labels(m, medium).inc(tokens - before)
        for medium, tier in stats.kv_tiers.items():
            before = self._last.kv_tiers.get(medium, {})
            for counter, key in (
                (self.tier_hits, "hits"),
                (self.tier_stores, "stores"),
                (self.tier_evictions, "evictions"),
                (self.tier_corrupted, "corrupted"),
                (self.tier_bytes_stored, "bytes_stored"),
                (self.tier_bytes_loaded, "bytes_loaded"),
            ):
                delta = tier.get(key, 0) - before.get(key, 0)
                if delta > 0:
                    counter.labels(m, medium).inc(delta)
            if tier.get("capacity_bytes"):
                self.tier_usage.labels(m, medium).set(tier["used_bytes"] / tier["capacity_bytes"])
            self.tier_load_p50.labels(m, medium).set(tier.get("load_p50_s", 0.0))
            self.tier_store_p50.labels(m, medium).set(tier.get("store_p50_s", 0.0))
        if stats.spec_decode is not None:
            self._on_spec_stats(stats.spec_decode)
        if stats.kv_transfer is not None:
            if self.kv_transfer is None:
                self.kv_transfer = KVTransferMetrics(self.registry, m)
            self.kv_transfer.update(stats.kv_transfer, self._last.kv_transfer)
        if stats.expert_load is not None:
            self._on_expert_load(stats.expert_load, self._last.expert_load)
        self._last = stats

    def _on_expert_load(self, load: list, before: list | None) -> None:
        """Tokens per expert (a counter per layer and expert) and each MoE layer's imbalance:
        its busiest expert's tokens over the mean (1.0 = even)."""
        m = self.model
        for layer, counts in enumerate(load):
            then = before[layer] if before else [0] * len(counts)
            for expert, (now, old) in enumerate(zip(counts, then, strict=True)):
                if now > old:
                    self.expert_tokens.labels(m, str(layer), str(expert)).inc(now - old)
            total = sum(counts)
            if total:
                self.expert_imbalance.labels(m, str(layer)).set(max(counts) * len(counts) / total)

    def _on_spec_stats(self, spec: SpecDecodeStats) -> None:
        m, before = self.model, self._last.spec_decode or SpecDecodeStats()
        for counter, now, then in (
            (self.spec_drafts, spec.num_drafts, before.num_drafts),
            (self.spec_draft_tokens, spec.num_draft_tokens, before.num_draft_tokens),
            (self.spec_accepted_tokens, spec.num_accepted_tokens, before.num_accepted_tokens),
        ):
            if now > then:
                counter.labels(m).inc(now - then)
        for counter, now_by, then_by in (
            (
                self.spec_draft_tokens_by_proposer,
                spec.draft_tokens_by_proposer,
                before.draft_tokens_by_proposer,
            ),
            (
                self.spec_accepted_tokens_by_proposer,
                spec.accepted_tokens_by_proposer,
                before.accepted_tokens_by_proposer,
            ),
        ):
            for name, count in now_by.items():
                if count > (then := then_by.get(name, 0)):
                    counter.labels(m, name).inc(count - then)
        for pos, count in enumerate(spec.accepted_per_pos):
            then = before.accepted_per_pos[pos] if pos < len(before.accepted_per_pos) else 0
            if count > then:
                self.spec_accepted_per_pos.labels(m, str(pos)).inc(count - then)
        for accepted, count in enumerate(spec.accepted_lengths):
            then = (
                before.accepted_lengths[accepted] if accepted < len(before.accepted_lengths) else 0
            )
            for _ in range(count - then):
                self.spec_acceptance_length.labels(m).observe(accepted + 1)

    def on_tokens(self, timing: RequestTiming, new_tokens: int, now: float) -> None:
        m = self.model
        self.generation_tokens.labels(m).inc(new_tokens)
        if timing.first_token is None:
            self.ttft.labels(m).observe(now - timing.arrival)
            self.registry.recent_ttft.add(now - timing.arrival)
            self.prompt_tokens.labels(m).inc(timing.num_prompt_tokens)
            if timing.first_scheduled is not None:
                self.queue_time.labels(m).observe(max(0.0, timing.first_scheduled - timing.arrival))
        elif timing.last_token is not None:
            gap = (now - timing.last_token) / new_tokens
            for _ in range(new_tokens):
                self.itl.labels(m).observe(gap)

    def on_finished(
        self, timing: RequestTiming, finish_reasons: list[str | None], now: float
    ) -> None:
        m = self.model
        self.e2e.labels(m).observe(now - timing.arrival)
        for reason in finish_reasons:
            self.request_success.labels(m, reason or "abort").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
