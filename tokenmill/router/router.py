"""The router's core: replicas, the cache index, bookings, and the decision for a request."""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tokenmill.router.approx import ApproxIndex
from tokenmill.router.config import RouterConfig
from tokenmill.router.cost import Candidate, candidate
from tokenmill.router.disagg import DisaggDecision, eligible_prefill, new_transfer_id
from tokenmill.router.index import KVIndex
from tokenmill.router.load import Booking, LoadTracker
from tokenmill.router.metrics import RouterMetrics
from tokenmill.router.policy import choose
from tokenmill.router.prompts import RequestKey
from tokenmill.router.replicas import Replica, ReplicaSpec
from tokenmill.router.subscriber import EventSubscriber

logger = logging.getLogger("tokenmill.router")
decision_log = logging.getLogger("tokenmill.router.decision")
RECENT_DECISIONS = 100  # kept for the dashboard (/ui/api/router)


@dataclass
class Decision:
    replica: Replica
    reason: str
    booking: Booking
    chosen: Candidate
    candidates: tuple[Candidate, ...]
    attempt: int = 0

    def summary(self, request_id: str, policy: str) -> dict:
        return {
            "request_id": request_id,
            "policy": policy,
            "replica": self.replica.name,
            "reason": self.reason,
            "attempt": self.attempt,
            "hit_blocks": self.chosen.hit_blocks,
            "prompt_blocks": round(self.chosen.prompt_blocks, 2),
            "candidates": [c.brief() for c in self.candidates],
        }

    def log_line(self, request_id: str, policy: str) -> str:
        return json.dumps(self.summary(request_id, policy))


class Router:
    def __init__(
        self,
        config: RouterConfig,
        specs: Iterable[ReplicaSpec],
        metrics: RouterMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.clock = clock  # monotonic seconds; the simulator passes its own time
        self.metrics = metrics or RouterMetrics()
        self.replicas: dict[str, Replica] = {}
        for spec in specs:
            if spec.name in self.replicas:
                raise ValueError(f"replica: {spec.url} given twice")
            self.replicas[spec.name] = Replica(spec)
        if not self.replicas:
            raise ValueError("replica: at least one is required")
        self.index = KVIndex()
        self.approx = ApproxIndex()
        self.loads = LoadTracker(config.booking_ttl_s)
        self.subscribers: dict[str, EventSubscriber] = {}
        self._events_on = False
        self._turn = 0
        # the latest decisions, newest last (what the debug decision log would print)
        self.recent: deque[tuple[float, str, str, Decision]] = deque(maxlen=RECENT_DECISIONS)
        self.metrics.on_collect(self._collect)

    # ------------------------------------------------------------ events

    def start_events(self) -> None:
        self._events_on = True
        for r in self.replicas.values():
            self._subscribe(r)

    def _subscribe(self, r: Replica) -> None:
        if self._events_on and r.spec.events and r.name not in self.subscribers:
            sub = EventSubscriber(
                r.name, self.index, r.spec.events, r.spec.replay, self.config.replay_timeout_s
            )
            self.subscribers[r.name] = sub
            sub.start()

    def stop_events(self) -> None:
        self._events_on = False
        for sub in self.subscribers.values():
            sub.stop()
        self.subscribers.clear()

    def event_state(self, name: str) -> str:
        """synced (complete index) | partial (a subset) | none (approximate index only)."""
        sub = self.subscribers.get(name)
        if sub is None or sub.state == "idle":
            return "none"
        return sub.state

    # ------------------------------------------------------------ membership

    def add_replica(self, spec: ReplicaSpec) -> Replica:
        """A replica joins (cluster discovery): unhealthy until its first health check, its
        index built from a full replay of its events."""
        if spec.name in self.replicas:
            raise ValueError(f"replica: {spec.url} is already routed to")
        r = self.replicas[spec.name] = Replica(spec)
        self._subscribe(r)
        logger.warning("replica %s joined", r.name)
        return r

    def drain(self, name: str) -> None:
        """No new requests for the replica; those in flight go on (see `in_flight`)."""
        r = self.replicas.get(name)
        if r is not None and not r.draining:
            r.draining = True
            logger.warning("replica %s draining (%d in flight)", name, self.in_flight(name))

    def in_flight(self, name: str) -> int:
        return self.loads.in_flight(name)

    def remove_replica(self, name: str) -> None:
        """The replica leaves: its subscriber stops and its index entries are purged."""
        r = self.replicas.pop(name, None)
        if r is None:
            return
        sub = self.subscribers.pop(name, None)
        if sub is not None:
            sub.stop()
        dropped = self.index.disable(name)
        self.approx.clear(name)
        self.loads.forget(name)
        self.metrics.forget_replica(name)
        logger.warning("replica %s left; dropped %d index blocks", name, dropped)

    # ------------------------------------------------------------ health

    def mark_up(self, name: str, info: dict) -> None:
        r = self.replicas.get(name)
        if r is None:
            return  # removed while its health check ran
        engine = info.get("engine") if isinstance(info, dict) else None
        engine = engine if isinstance(engine, dict) else {}
        pid = engine.get("pid")
        restarted = r.pid is not None and pid is not None and pid != r.pid
        r.info = info
        r.learn_kv_transfer(info)
        block_size = engine.get("block_size")
        if type(block_size) is int and block_size > 0:
            r.block_size = block_size
        r.pid = pid if pid is not None else r.pid
        r.failures = 0
        if r.healthy and not restarted:
            return
        logger.warning("replica %s is up%s", name, " (restarted)" if restarted else "")
        r.healthy = r.ever_healthy = True
        r.last_error = None
        self.metrics.health_changes.labels(name, "up").inc()
        self.approx.clear(name)
        self.index.enable(name)
        sub = self.subscribers.get(name)
        if sub is not None:
            sub.resync()

    def mark_down(self, name: str, reason: str) -> None:
        """No more traffic; its index entries go (they come back by resync on rejoin)."""
        r = self.replicas.get(name)
        if r is None:
            return
        r.last_error = reason
        if not r.healthy:
            return
        r.healthy = False
        dropped = self.index.disable(name)
        self.approx.clear(name)
        self.metrics.health_changes.labels(name, "down").inc()
        logger.warning("replica %s is down (%s); dropped %d index blocks", name, reason, dropped)

    def healthy(self) -> list[Replica]:
        """Replicas that take new requests (healthy, not draining)."""
        return [r for r in self.replicas.values() if r.healthy and not r.draining]

    def recent_decisions(self) -> list[dict]:
        """The latest decisions, newest last, as the debug decision log prints them."""
        return [{"t": t, **d.summary(rid, policy)} for t, rid, policy, d in list(self.recent)]

    # ------------------------------------------------------------ decisions

    def candidates(self, key: RequestKey | None, replicas: list[Replica]) -> list[Candidate]:
        now = self.clock()
        out = []
        distinct_by_size: dict[int, frozenset[int]] = {}  # the prompt's hashes, per block size
        tiers_by_name: dict[str, list[int]] = {}
        if key is not None:  # one walk of the prompt per block size, for all its replicas
            for size in {r.block_size for r in replicas}:
                names = [r.name for r in replicas if r.block_size == size]
                tiers_by_name.update(self.index.tiers_of(names, key.hashes(size)))
        for r in replicas:
            name = r.name
            if key is None:
                tiers: list[int] = []
                approx, num_tokens = 0, 0
                distinct: frozenset[int] = frozenset()
            else:
                hashes = key.hashes(r.block_size)
                tiers = tiers_by_name[name]
                approx = self.approx.prefix(name, hashes, now)
                num_tokens = key.num_tokens
                distinct = distinct_by_size.get(r.block_size)
                if distinct is None:
                    distinct = distinct_by_size[r.block_size] = frozenset(hashes)
            out.append(
                candidate(
                    name,
                    num_tokens,
                    r.block_size,
                    tiers,
                    approx,
                    self.loads.pending_prefill(name, now),
                    self.loads.active_blocks(name, distinct),
                    self.loads.in_flight(name),
                    self.config.weights,
                )
            )
        return out

    def decide(
        self,
        key: RequestKey | None,
        request_id: str,
        exclude: Iterable[str] = (),
        attempt: int = 0,
    ) -> Decision | None:
        """Chooses a healthy replica and books the request there at once; None if none."""
        skip = set(exclude)
        pool = [r for r in self.healthy() if r.name not in skip and r.role != "prefill"]
        if not pool:
            return None
        cands = self.candidates(key, pool)
        self._turn += 1
        session = key.session if key else None
        chosen, reason = choose(self.config.policy, cands, self.config.guard, self._turn, session)
        replica = self.replicas[chosen.replica]
        hashes = key.hashes(replica.block_size) if key else ()
        now = self.clock()
        booking = self.loads.book(request_id, replica.name, hashes, chosen.new_prefill, now)
        if hashes:
            ttl = (
                self.config.confirm_ttl_s
                if self.event_state(replica.name) == "synced"
                else self.config.approx_ttl_s
            )
            self.approx.record(replica.name, hashes, ttl, now)
        decision = Decision(replica, reason, booking, chosen, tuple(cands), attempt)
        m = self.metrics
        m.decisions.labels(self.config.policy, replica.name, reason).inc()
        m.hit_blocks.labels(replica.name).inc(chosen.hit_blocks)
        m.prompt_blocks.inc(len(hashes))
        if reason == "imbalance_guard":
            m.guard_triggers.inc()
        # kept as is, summarized when read: a summary per decision costs ~6 us per candidate
        self.recent.append((round(time.time(), 3), request_id, self.config.policy, decision))
        if decision_log.isEnabledFor(logging.DEBUG):
            decision_log.debug(decision.log_line(request_id, self.config.policy))
        return decision

    def decide_disagg(
        self, key: RequestKey | None, decision: Decision, request_id: str
    ) -> DisaggDecision:
        """Whether a prefill worker computes this prompt for the decided (decode) replica;
        if so, which one (cache-aware among the unsaturated ones), booked at once."""
        config = self.config.disagg
        uncached = 0
        if key is not None:
            uncached = max(
                0, key.num_tokens - decision.chosen.hit_blocks * decision.replica.block_size
            )
        fits = key.num_tokens if key is not None else 0  # the prompt must fit its KV pool
        pool = [
            r for r in self.healthy()
            if r.role == "prefill" and r.kv_endpoint and r.info.get("max_model_len", fits + 1) > fits
        ]  # fmt: skip
        in_flight = {r.name: self.loads.in_flight(r.name) for r in pool}
        now = self.clock()
        queued = {  # the prefill work this prompt would wait for on each worker
            r.name: self.loads.pending_prefill(
                r.name, now, uncached / r.block_size if r.prompt_share_tokens else None
            ) * r.block_size
            for r in pool
        }  # fmt: skip
        num_seqs = key.num_seqs if key is not None else 0
        if decision.replica.role != "decode":
            free, code, why = (
                [],
                "not_decode_worker",
                f"{decision.replica.name} is not a decode worker",
            )
        else:
            streams = max(0, self.loads.in_flight(decision.replica.name) - 1)  # booked: this
            free, code, why = eligible_prefill(
                config, uncached, num_seqs, pool, in_flight, queued, streams
            )
        if not free or key is None:
            self.metrics.kv_transfer_decisions.labels("local", code).inc()
            out = DisaggDecision(False, why, uncached)
            self._log_disagg(request_id, decision, out)
            return out
        cands = self.candidates(key, free)
        best = min(cands, key=lambda c: c.cost)
        prefill = self.replicas[best.replica]
        hashes = key.hashes(prefill.block_size)
        booking = self.loads.book(
            request_id + "/prefill", prefill.name, hashes, best.new_prefill, now
        )
        self.metrics.kv_transfer_decisions.labels("remote", code).inc()
        out = DisaggDecision(True, why, uncached, prefill, booking, new_transfer_id())
        self._log_disagg(request_id, decision, out)
        return out

    def _log_disagg(self, request_id: str, decision: Decision, dd: DisaggDecision) -> None:
        if decision_log.isEnabledFor(logging.DEBUG):
            line = {"request_id": request_id, "decode": decision.replica.name, **dd.brief()}
            decision_log.debug(json.dumps({"disaggregation": line}))

    def first_token(self, decision: Decision) -> None:
        self.loads.first_token(decision.booking)

    def finish(self, decision: Decision) -> None:
        self.loads.finish(decision.booking)

    # ------------------------------------------------------------ introspection

    def snapshot(self) -> dict:
        now = self.clock()
        return {
            "policy": self.config.policy,
            "replicas": [
                {
                    "name": r.name,
                    "url": r.url,
                    "healthy": r.healthy,
                    "draining": r.draining,
                    "last_error": r.last_error,
                    "block_size": r.block_size,
                    "pid": r.pid,
                    "events": self.event_state(r.name),
                    "event_stats": vars(self.subscribers[r.name].stats)
                    if r.name in self.subscribers
                    else None,
                    "index_blocks": self.index.sizes_by_medium(r.name),
                    "approx_blocks": self.approx.size(r.name, now),
                    "in_flight": self.loads.in_flight(r.name),
                    "pending_prefill_blocks": round(self.loads.pending_prefill(r.name, now), 2),
                    "active_blocks": self.loads.active_blocks(r.name),
                    "role": r.role,
                    "kv_endpoint": r.kv_endpoint,
                    "kv_transfer": r.kv_transfer_stats or None,
                }
                for r in list(self.replicas.values())
            ],
        }

    def _collect(self, m: RouterMetrics) -> None:
        now = self.clock()
        for r in list(self.replicas.values()):
            m.healthy.labels(r.name).set(1 if r.healthy else 0)
            m.in_flight.labels(r.name).set(self.loads.in_flight(r.name))
            m.pending_prefill.labels(r.name).set(self.loads.pending_prefill(r.name, now))
            for medium, n in self.index.sizes_by_medium(r.name).items():
                m.index_blocks.labels(r.name, medium).set(n)
            m.events_synced.labels(r.name).set(1 if self.event_state(r.name) == "synced" else 0)
            m.kv_transfer_from(r.name, r.kv_transfer_stats)
            sub = self.subscribers.get(r.name)
            if sub is not None:
                m.add_delta(m.event_batches, r.name, "batches", sub.stats.batches)
                m.add_delta(m.event_gaps, r.name, "gaps", sub.stats.gaps)
                m.add_delta(m.event_resyncs, r.name, "resyncs", sub.stats.resyncs)
                m.add_delta(m.event_bad_batches, r.name, "bad_batches", sub.stats.bad_batches)
                m.add_delta(m.event_errors, r.name, "errors", sub.stats.errors)
