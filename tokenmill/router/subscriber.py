"""Follows one replica's KV event stream into the index: ordered by sequence number, gaps
filled from the replay socket, a full resync (replay from 0) when a gap cannot be filled
and whenever the router (re)joins a replica.

States: `synced` — the index holds everything the replica published (the replay buffer
went back to its first batch); `partial` — some batches are lost for good (buffer wrapped,
no replay socket, replay timed out): the index is a subset of the truth (a resync clears it
first, so it never claims blocks that were removed) and the router adds its approximate
index for this replica; `idle` — not following.

A malformed batch (undecodable, wrong shape or types) is never applied, not even in part,
and does not advance the sequence: it counts as lost and is replayed like any gap. An
unexpected error (a bug, the index failing) does not end the thread: the replica's entries
are purged (no half-applied batch keeps claiming blocks), and after a short backoff the
subscriber reconnects and resyncs in full.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from tokenmill.router.batches import BadBatch, Event, decode_events
from tokenmill.router.index import KVIndex

logger = logging.getLogger(__name__)

TOPIC = b"kv-events"
BACKOFF_S = 0.1  # after an error; doubles with each error in a row
MAX_BACKOFF_S = 5.0


@dataclass
class SubscriberStats:
    batches: int = 0
    duplicates: int = 0
    gaps: int = 0
    gaps_filled: int = 0
    resyncs: int = 0
    replayed: int = 0
    lost: int = 0  # batches known to be gone for good
    bad_batches: int = 0  # malformed messages
    errors: int = 0  # unexpected failures, each followed by a restart and full resync


class EventSubscriber:
    def __init__(
        self,
        replica: str,
        index: KVIndex,
        endpoint: str,
        replay_endpoint: str | None,
        replay_timeout_s: float = 2.0,
        on_change: Callable[[str, str], None] | None = None,
    ) -> None:
        self.replica = replica
        self.index = index
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.replay_timeout_ms = int(replay_timeout_s * 1000)
        self.on_change = on_change  # (replica, state), e.g. for metrics
        self.stats = SubscriberStats()
        self.state = "idle"
        self.last_seq: int | None = None
        self._ctx = zmq.Context()
        self._stop = threading.Event()
        self._resync = threading.Event()
        self._connected = threading.Event()
        self._thread: threading.Thread | None = None
        # fault injection for tests: return True to drop a live batch (seq) unseen
        self.drop_live: Callable[[int], bool] | None = None

    # ------------------------------------------------------------ control

    def start(self) -> None:
        self._resync.set()
        self._connected.set()
        self._thread = threading.Thread(
            target=self._run, name=f"kv-events-{self.replica}", daemon=True
        )
        self._thread.start()

    def resync(self) -> None:
        """Rebuild this replica's index from its replay buffer (on join and rejoin)."""
        self._resync.set()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        self._ctx.term()

    def attach(self) -> None:
        """Follows a stream from its first batch without a thread or socket: `deliver` hands
        it each batch (a transport that loses nothing, such as the simulator's)."""
        self.last_seq = -1  # as a full resync of an empty buffer: the next batch is 0
        self._set_state("synced")

    def deliver(self, seq: int, payload: bytes) -> None:
        """One live batch, as if received off the socket."""
        self._on_live(seq, payload)

    def _set_state(self, state: str) -> None:
        if state != self.state:
            logger.info("kv events of %s: %s -> %s", self.replica, self.state, state)
            self.state = state
            if self.on_change:
                self.on_change(self.replica, state)

    # ------------------------------------------------------------ loop

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._follow()
            except zmq.ContextTerminated:
                return
            except Exception:
                if time.monotonic() - started > MAX_BACKOFF_S:
                    failures = 0  # it had been running fine
                failures += 1
                backoff = min(MAX_BACKOFF_S, BACKOFF_S * 2 ** (failures - 1))
                logger.exception(
                    "kv events of %s: subscriber failed; full resync in %.1fs",
                    self.replica, backoff,
                )  # fmt: skip
                self._failed()
                self._resync.set()
                self._stop.wait(backoff)

    def _failed(self) -> None:
        """Nothing half-applied may keep claiming blocks until the resync."""
        self.stats.errors += 1
        self.last_seq = None
        try:
            self.index.clear(self.replica)
            self._set_state("partial")
        except Exception:
            logger.exception("kv events of %s: purge failed", self.replica)

    def _follow(self) -> None:
        """Receives live batches on a fresh socket until stopped."""
        sub = self._ctx.socket(zmq.SUB)
        try:
            sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
            sub.setsockopt(zmq.RCVHWM, 100_000)
            sub.setsockopt(zmq.LINGER, 0)
            sub.connect(self.endpoint)
            poller = zmq.Poller()
            poller.register(sub, zmq.POLLIN)
            while not self._stop.is_set():
                if self._resync.is_set():
                    self._resync.clear()
                    self._full_resync()
                if not poller.poll(100):
                    continue
                frames = sub.recv_multipart(zmq.NOBLOCK)
                if len(frames) != 3 or len(frames[1]) != 8:
                    self.stats.bad_batches += 1  # no sequence number: the next gap tells
                    continue
                seq = int.from_bytes(frames[1], "big")
                if self.drop_live is not None and self.drop_live(seq):
                    continue
                self._on_live(seq, frames[2])
        finally:
            sub.close(0)

    def _on_live(self, seq: int, payload: bytes) -> None:
        last = self.last_seq
        if last is not None and seq <= last:
            self.stats.duplicates += 1  # already applied through a replay
            return
        events = self._decode(seq, payload)
        in_order = seq == last + 1 if last is not None else self.state != "idle"
        if events is not None and in_order:
            self._commit(seq, events)
            return
        # a gap, a malformed batch (one more missing), or first contact: replay first
        if last is None:
            self._full_resync()
        else:
            self.stats.gaps += 1
            logger.info("kv events of %s: gap %d..%d", self.replica, last + 1, seq)
            if self._fill(last + 1):
                self.stats.gaps_filled += 1
            else:
                self._full_resync()
        if self.last_seq is not None and seq <= self.last_seq:
            return  # the replay brought this batch
        if events is None:
            self._lose(seq, seq)
            return
        if self.last_seq is not None and seq > self.last_seq + 1:
            self._lose(self.last_seq + 1, seq - 1)
        self._commit(seq, events)

    def _decode(self, seq: int, payload: bytes) -> list[Event] | None:
        try:
            return decode_events(payload)
        except BadBatch as e:
            self.stats.bad_batches += 1
            logger.warning("kv events of %s: bad batch %d: %s", self.replica, seq, e)
            return None

    def _commit(self, seq: int, events: list[Event]) -> None:
        self.index.apply(self.replica, events)
        self.last_seq = seq
        self.stats.batches += 1

    def _lose(self, first: int, last: int) -> None:
        """Batches first..last are gone for good: what came before them cannot be trusted
        (they may have removed it), what follows can."""
        self.stats.lost += last - first + 1
        self.index.clear(self.replica)
        self.last_seq = last
        self._set_state("partial")

    # ------------------------------------------------------------ replay

    def _replay(self, start: int) -> list[tuple[int, bytes]] | None:
        """Batches from `start` on, from the replay socket; None when it does not answer."""
        if not self.replay_endpoint:
            return None
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(self.replay_endpoint)
            sock.send_multipart([b"", start.to_bytes(8, "big")])
            out: list[tuple[int, bytes]] = []
            while True:
                if not sock.poll(self.replay_timeout_ms):
                    logger.warning("kv events of %s: replay timed out", self.replica)
                    return None
                frames = sock.recv_multipart()
                if len(frames) < 3:
                    continue
                seq, payload = int.from_bytes(frames[-2], "big"), frames[-1]
                if not payload:
                    return out
                out.append((seq, payload))
        finally:
            sock.close(0)

    def _fill(self, start: int) -> bool:
        """Applies the batches from `start` on; False if the replay cannot cover the gap."""
        batches = self._replay(start)
        if not batches or batches[0][0] != start:
            return False
        for seq, payload in batches:
            if self.last_seq is not None and seq != self.last_seq + 1:
                return False
            events = self._decode(seq, payload)
            if events is None:
                return False
            self._commit(seq, events)
            self.stats.replayed += 1
        return True

    def _full_resync(self) -> None:
        """Clears the replica's index and replays its whole buffer."""
        self.stats.resyncs += 1
        self.index.clear(self.replica)
        self.last_seq = None
        batches = self._replay(0)
        if batches is None:
            self._set_state("partial")  # live events from here on, nothing older
            return
        complete = not batches or batches[0][0] == 0
        if not complete:
            self.stats.lost += batches[0][0]
        for seq, payload in batches:
            if self.last_seq is not None and seq > self.last_seq + 1:
                self._lose(self.last_seq + 1, seq - 1)  # a hole in the buffer
                complete = False
            events = self._decode(seq, payload)
            if events is None:
                self._lose(seq, seq)
                complete = False
            else:
                self._commit(seq, events)
            self.stats.replayed += 1
        if not batches:
            self.last_seq = -1  # nothing published yet: the next live batch is 0
        self._set_state("synced" if complete else "partial")
