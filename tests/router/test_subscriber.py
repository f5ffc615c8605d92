"""The event subscriber against the engine's own publisher over real ZMQ sockets: initial
resync from the replay buffer, gaps filled by replay, unfillable gaps, no replay socket."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tokenmill.kv.events import KVEventPublisher
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

    def subscribe(with_replay: bool = True) -> tuple[EventSubscriber, KVIndex]:
        index = KVIndex()
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
