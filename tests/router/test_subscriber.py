"""The event subscriber against the engine's own publisher over real ZMQ sockets: initial
resync from the replay buffer, gaps filled by replay, unfillable gaps, no replay socket,
malformed batches and failures inside the subscriber."""

from __future__ import annotations

import time
from collections.abc import Callable

import msgpack
import pytest

from tokenmill.kv.events import KVEventPublisher, decode_batch, encode_batch
from tokenmill.router.cluster import free_port
from tokenmill.router.index import DEVICE, KVIndex
from tokenmill.router.subscriber import EventSubscriber


def wait_until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def stored(*hashes: int):
    return [["BlockStored", list(hashes), None, [], 16, None, "device"]]


def removed(*hashes: int):
    return [["BlockRemoved", list(hashes), "device"]]


@pytest.fixture
def stream(request):
    """(publisher, subscriber factory); everything closed afterwards."""
    buffer = getattr(request, "param", 10000)
    ep, rp = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    pub = KVEventPublisher(ep, rp, buffer=buffer)
    subs: list[EventSubscriber] = []

    def subscribe(
        with_replay: bool = True, index: KVIndex | None = None
    ) -> tuple[EventSubscriber, KVIndex]:
        index = index or KVIndex()
        index.enable("r")
        sub = EventSubscriber("r", index, ep, rp if with_replay else None, replay_timeout_s=1)
        subs.append(sub)
        sub.start()
        return sub, index

    yield pub, subscribe
    for sub in subs:
        sub.stop()
    pub.close()


def settle(pub: KVEventPublisher, sub: EventSubscriber, marker: int) -> None:
    """Publishes a marker batch until the subscriber has it (the SUB socket is connected)."""
    deadline = time.monotonic() + 10
    while True:
        seq = pub.publish(stored(marker))
        try:
            wait_until(lambda s=seq: sub.last_seq is not None and sub.last_seq >= s, 0.5)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise


def test_joining_late_replays_the_buffer(stream):
    pub, subscribe = stream
    for h in range(5):
        pub.publish(stored(h))
    pub.publish(removed(0))
    sub, index = subscribe()
    wait_until(lambda: sub.state == "synced")
    assert sub.last_seq == 5 and sub.stats.replayed == 6
    assert index.tiers("r", [1, 2, 3, 4]) == [DEVICE] * 4 and index.tiers("r", [0]) == []
    settle(pub, sub, 100)
    assert index.tiers("r", [100]) == [DEVICE]


def test_gap_is_filled_from_the_replay_socket(stream):
    pub, subscribe = stream
    sub, index = subscribe()
    wait_until(lambda: sub.state == "synced")
    settle(pub, sub, 100)
    start = sub.last_seq + 1
    sub.drop_live = lambda seq: start + 1 <= seq <= start + 3  # lose three live batches
    seqs = [pub.publish(stored(200 + i)) for i in range(6)]
    pub.publish(removed(201))
    wait_until(lambda: sub.last_seq == seqs[-1] + 1)
    assert sub.stats.gaps == 1 and sub.stats.gaps_filled == 1
    # the replay brings the lost batches and any published since (those arrive again live)
    assert sub.stats.replayed >= 3
    assert sub.stats.resyncs == 1  # only the initial one
    assert index.tiers("r", [200]) == [DEVICE] and index.tiers("r", [201]) == []
    assert index.tiers("r", [202, 203, 204, 205]) == [DEVICE] * 4
    assert sub.state == "synced"


@pytest.mark.parametrize("stream", [4], indirect=True)
def test_unfillable_gap_resyncs_to_a_safe_subset(stream):
    pub, subscribe = stream
    sub, index = subscribe()
    wait_until(lambda: sub.state == "synced")
    settle(pub, sub, 1)
    start = sub.last_seq + 1
    sub.drop_live = lambda seq: start <= seq < start + 8  # more than the buffer keeps
    pub.publish(removed(1))  # lost for good: the index must not keep claiming block 1
    for i in range(7):
        pub.publish(stored(300 + i))
    last = pub.publish(stored(400))
    wait_until(lambda: sub.last_seq == last)
    assert sub.stats.gaps == 1 and sub.stats.gaps_filled == 0 and sub.stats.resyncs == 2
    assert sub.state == "partial" and sub.stats.lost > 0
    assert index.tiers("r", [1]) == []  # cleared, not stale
    assert index.tiers("r", [400]) == [DEVICE] and index.tiers("r", [306]) == [DEVICE]
    assert index.size("r") <= 4  # only what the buffer still had


def test_without_replay_socket_follows_live_events_as_partial(stream):
    pub, subscribe = stream
    pub.publish(stored(1))  # before joining: unknowable
    sub, index = subscribe(with_replay=False)
    wait_until(lambda: sub.state == "partial")
    settle(pub, sub, 2)
    assert index.tiers("r", [2]) == [DEVICE] and index.tiers("r", [1]) == []


def test_resync_on_request_rebuilds_the_index(stream):
    pub, subscribe = stream
    for h in range(3):
        pub.publish(stored(h))
    sub, index = subscribe()
    wait_until(lambda: index.size("r") == 3)
    index.clear("r")  # e.g. the replica left and came back
    sub.resync()
    wait_until(lambda: index.size("r") == 3 and sub.stats.resyncs == 2)
    assert sub.state == "synced"


def test_all_blocks_cleared_and_bad_batches(stream):
    pub, subscribe = stream
    sub, index = subscribe()
    wait_until(lambda: sub.state == "synced")
    settle(pub, sub, 5)
    pub.pub.send_multipart([b"kv-events", b"short", b"x"])  # malformed frames: ignored
    pub.publish([["AllBlocksCleared"]])
    last = pub.publish(stored(6))
    wait_until(lambda: sub.last_seq == last)
    assert index.tiers("r", [5]) == [] and index.tiers("r", [6]) == [DEVICE]


def truth(pub: KVEventPublisher) -> dict[int, int]:
    """What the replica holds: every batch it published, applied in order."""
    index = KVIndex()
    index.enable("r")
    hashes: set[int] = set()
    for _seq, payload in list(pub.buffer):
        events = decode_batch(payload)[1]
        index.apply("r", events)
        hashes.update(h for ev in events if len(ev) > 1 for h in ev[1])
    return {h: bits for h in hashes if (bits := index.holders(h).get("r", 0))}


def held(index: KVIndex, pub: KVEventPublisher) -> dict[int, int]:
    want = truth(pub)
    assert index.size("r") == len(want)
    return {h: index.holders(h).get("r", 0) for h in want}


def publish_corrupted(pub: KVEventPublisher, events: list, live_payload: bytes) -> int:
    """Publishes `events`, but the live copy arrives as `live_payload` (corrupted on the
    way); the replay buffer keeps the real batch."""
    with pub.lock:
        seq = pub.seq
        pub.seq += 1
        pub.buffer.append((seq, encode_batch(time.time(), events)))
    pub.pub.send_multipart([b"kv-events", seq.to_bytes(8, "big"), live_payload])
    return seq


BAD_PAYLOADS = {
    "garbage": b"\xc1 not msgpack",
    "wrong_shape": msgpack.packb({"ts": 0, "events": []}),
    "hash_not_int": msgpack.packb([0.0, [["BlockStored", ["h"], None, [], 16, None, "device"]]]),
    # the first event is fine: it must not be applied without the second
    "medium_not_str": msgpack.packb([0.0, [stored(8)[0], ["BlockRemoved", [100], 5]]]),
}


@pytest.mark.parametrize("bad", BAD_PAYLOADS)
def test_malformed_live_batch_is_replayed_not_skipped(stream, bad):
    pub, subscribe = stream
    sub, index = subscribe()
    wait_until(lambda: sub.state == "synced")
    settle(pub, sub, 100)
    seq = publish_corrupted(pub, stored(7) + removed(100), BAD_PAYLOADS[bad])
    last = pub.publish(stored(8))
    wait_until(lambda: sub.last_seq == last)
    assert sub.stats.bad_batches == 1 and sub.stats.gaps_filled == 1 and sub.stats.errors == 0
    assert sub.state == "synced" and sub.last_seq > seq
    assert held(index, pub) == truth(pub) == {7: DEVICE, 8: DEVICE}


def test_batch_malformed_at_the_source_leaves_a_safe_subset(stream):
    """The replay has the same bad batch: it is lost for good. Nothing of it is applied, and
    nothing from before it is trusted (it may have removed that); what follows is."""
    pub, subscribe = stream
    sub, index = subscribe()
    wait_until(lambda: sub.state == "synced")
    settle(pub, sub, 100)
    pub.publish([stored(8)[0], ["BlockRemoved", [100], 5]])  # medium of the wrong type
    last = pub.publish(stored(9))
    wait_until(lambda: sub.last_seq == last)
    assert sub.state == "partial" and sub.stats.lost == 1 and sub.stats.errors == 0
    assert index.tiers("r", [8]) == [] and index.tiers("r", [100]) == []
    assert index.tiers("r", [9]) == [DEVICE] and index.size("r") == 1
    settle(pub, sub, 10)  # and it keeps following
    assert index.tiers("r", [10]) == [DEVICE]


class FailingIndex(KVIndex):
    """Fails once in the middle of the batch that stores `block`, after its first event."""

    def __init__(self, block: int) -> None:
        super().__init__()
        self.block: int | None = block

    def apply(self, replica, events) -> None:
        if self.block is not None and any(self.block in ev[1] for ev in events if len(ev) > 1):
            self.block = None
            super().apply(replica, events[:1])
            raise RuntimeError("injected")
        super().apply(replica, events)


def test_error_inside_the_index_restarts_with_a_full_resync(stream):
    pub, subscribe = stream
    sub, index = subscribe(index=FailingIndex(block=7))
    wait_until(lambda: sub.state == "synced")
    settle(pub, sub, 100)
    pub.publish(stored(7) + removed(100))  # fails after storing 7, before removing 100
    wait_until(lambda: sub.stats.errors == 1)
    wait_until(lambda: sub.state == "synced" and sub.stats.resyncs == 2)
    assert sub._thread is not None and sub._thread.is_alive()
    settle(pub, sub, 11)
    assert held(index, pub) == truth(pub)
    assert index.tiers("r", [7, 11]) == [DEVICE, DEVICE] and index.tiers("r", [100]) == []
