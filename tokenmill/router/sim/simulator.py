"""The simulation: trace releases, routing by the real `Router`, replica steps, KV events.

One event heap in simulated seconds. A request goes out at its trace time (a session's next
turn not before its previous reply is complete), is routed by `Router.decide` (on the
router's clock, which is the simulation's), and waits in its replica's queue. Each replica
step that completes publishes its KV events, which reach the router's index through the
router's own `EventSubscriber` (sequence check, batch decode, `KVIndex.apply`); first tokens
and finishes release the router's bookings as the proxy does.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from dataclasses import dataclass, field

from tokenmill.kv.hashing import external_hash
from tokenmill.router.config import RouterConfig
from tokenmill.router.prompts import RequestKey
from tokenmill.router.replicas import ReplicaSpec
from tokenmill.router.router import Decision, Router
from tokenmill.router.sim.conversations import Conversations, Prompt
from tokenmill.router.sim.replica import ReplicaConfig, SimReplica, SimSequence
from tokenmill.router.sim.trace import Trace, TraceRequest
from tokenmill.router.subscriber import EventSubscriber

RELEASE, STEP = 0, 1


@dataclass
class Record:
    """One request's outcome."""

    request_id: str
    arrival: float
    replica: str
    reason: str
    prompt_tokens: int
    cached_tokens: int  # found in the replica's prefix cache at admission
    predicted_hit_tokens: int  # what the router's index said
    ttft: float
    latency: float


@dataclass
class SimResult:
    policy: str
    replicas: int
    records: list[Record]
    wall_s: float  # this process's time for the whole run
    decide_s: list[float]  # CPU time of each Router.decide
    span_s: float  # simulated seconds, first release to last finish
    busy_s: float  # replicas' step time, summed
    reasons: Counter[str] = field(default_factory=Counter)


class Simulation:
    def __init__(
        self,
        trace: Trace,
        num_replicas: int,
        router_config: RouterConfig,
        replica_config: ReplicaConfig | None = None,
    ) -> None:
        self.trace = trace
        self.replica_config = replica_config or ReplicaConfig()
        self.block_size = self.replica_config.block_size
        self.now = 0.0
        specs = [ReplicaSpec(f"http://sim-{i}:8000") for i in range(num_replicas)]
        self.router = Router(router_config, specs, clock=lambda: self.now)
        self.replicas: dict[str, SimReplica] = {}
        for name in self.router.replicas:
            self.router.mark_up(name, {"engine": {"block_size": self.block_size, "pid": 1}})
            sub = EventSubscriber(name, self.router.index, f"inproc://{name}", None)
            sub.attach()
            self.router.subscribers[name] = sub
            self.replicas[name] = SimReplica(name, self.replica_config, sub.deliver)
        self.conversations = Conversations(trace, self.block_size)
        self._turns: dict[int, list[TraceRequest]] = {}
        for r in trace.requests:
            self._turns.setdefault(r.session, []).append(r)
        for turns in self._turns.values():
            turns.sort(key=lambda r: r.turn)
        self._heap: list[tuple[float, int, int, object, int]] = []
        self._order = 0
        self._version: dict[str, int] = dict.fromkeys(self.replicas, 0)
        self._inflight: dict[str, tuple[TraceRequest, Prompt]] = {}
        self.records: list[Record] = []
        self.decide_s: list[float] = []

    def _push(self, t: float, kind: int, obj: object, version: int = 0) -> None:
        self._order += 1
        heapq.heappush(self._heap, (t, self._order, kind, obj, version))

    def run(self) -> SimResult:
        start = time.perf_counter()
        for turns in self._turns.values():
            self._push(turns[0].t, RELEASE, turns[0])
        first = self._heap[0][0] if self._heap else 0.0
        try:
            while self._heap:
                t, _, kind, obj, version = heapq.heappop(self._heap)
                self.now = t
                if kind == RELEASE:
                    self._release(obj)  # type: ignore[arg-type]
                elif version == self._version[obj]:  # type: ignore[index]
                    self._step_done(self.replicas[obj])  # type: ignore[index]
        finally:
            self.router.stop_events()
        reasons = Counter(r.reason for r in self.records)
        return SimResult(
            self.router.config.policy,
            len(self.replicas),
            self.records,
            time.perf_counter() - start,
            self.decide_s,
            self.now - first,
            sum(r.busy_s for r in self.replicas.values()),
            reasons,
        )

    # ------------------------------------------------------------ events

    def _release(self, r: TraceRequest) -> None:
        prompt = self.conversations.prompt(r)
        ids = prompt.token_ids
        event_hashes = tuple(external_hash(h) for h in prompt.hashes)
        # the hashes as RequestKey.hashes would compute them (tests check it), made once
        key = RequestKey(
            tuple(ids), len(ids), session=str(r.session), _hashes={self.block_size: event_hashes}
        )
        t0 = time.process_time()  # CPU time: other processes on the machine don't count
        decision = self.router.decide(key, r.request_id)
        self.decide_s.append(time.process_time() - t0)
        assert decision is not None  # every replica is up
        replica = self.replicas[decision.replica.name]
        seq = SimSequence(
            r.request_id, ids, prompt.hashes, self.conversations.reply(r), self.now, decision
        )
        self._inflight[r.request_id] = (r, prompt)
        replica.add(seq)
        if replica.run is None:
            self._schedule(replica, replica.plan(self.now))
        else:
            self._schedule(replica, replica.interrupt(self.now))

    def _schedule(self, replica: SimReplica, end: float | None) -> None:
        if end is None:
            return
        self._version[replica.name] += 1  # a run cut short leaves a stale event behind
        self._push(end, STEP, replica.name, self._version[replica.name])

    def _step_done(self, replica: SimReplica) -> None:
        first, done = replica.finish_run(self.now)
        for seq in first:
            self.router.first_token(seq.tag)
        for seq in done:
            self._finished(replica, seq)
        self._schedule(replica, replica.plan(self.now))

    def _finished(self, replica: SimReplica, seq: SimSequence) -> None:
        decision: Decision = seq.tag
        self.router.finish(decision)
        r, prompt = self._inflight.pop(seq.request_id)
        assert seq.first_token_time is not None
        self.records.append(
            Record(
                seq.request_id,
                seq.arrival,
                replica.name,
                decision.reason,
                seq.num_prompt_tokens,
                seq.cached_tokens,
                decision.chosen.hit_blocks * self.block_size,
                seq.first_token_time - seq.arrival,
                self.now - seq.arrival,
            )
        )
        turns = self._turns[r.session]
        if r.turn + 1 < len(turns):
            self.conversations.finished(r, prompt)
            nxt = turns[r.turn + 1]
            self._push(max(nxt.t, self.now), RELEASE, nxt)
        else:
            self.conversations.end(r.session)
