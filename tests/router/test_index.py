"""The event-built index and the approximate index, with synthetic events."""

from __future__ import annotations

from tokenmill.router.approx import ApproxIndex
from tokenmill.router.index import DEVICE, DISK, HOST, KVIndex


def stored(hashes, medium="device", parent=None):
    return ["BlockStored", list(hashes), parent, [], 16, None, medium]


def removed(hashes, medium="device"):
    return ["BlockRemoved", list(hashes), medium]


def test_stored_removed_and_tiers():
    ix = KVIndex()
    ix.enable("a")
    ix.apply("a", [stored([1, 2, 3]), stored([2], "host"), stored([3], "disk")])
    assert ix.tiers("a", [1, 2, 3, 4]) == [DEVICE, DEVICE | HOST, DEVICE | DISK]
    ix.apply("a", [removed([2])])  # evicted from device, still in host
    assert ix.tiers("a", [1, 2, 3]) == [DEVICE, HOST, DEVICE | DISK]
    ix.apply("a", [removed([2], "host")])
    assert ix.tiers("a", [1, 2, 3]) == [DEVICE]  # stops at the first block it lacks
    assert ix.sizes_by_medium("a") == {"device": 2, "host": 0, "disk": 1}
    ix.apply("a", [removed([99])])  # unknown block: no-op
    assert ix.size("a") == 2


def test_replicas_are_separate_and_cleared():
    ix = KVIndex()
    for r in ("a", "b"):
        ix.enable(r)
    ix.apply("a", [stored([1, 2])])
    ix.apply("b", [stored([1])])
    assert ix.holders(1) == {"a": DEVICE, "b": DEVICE}
    ix.apply("a", [["AllBlocksCleared"]])
    assert ix.tiers("a", [1]) == [] and ix.tiers("b", [1]) == [DEVICE]
    assert ix.holders(2) == {}


def test_one_walk_for_many_replicas_equals_one_walk_each():
    import random

    rng = random.Random(0)
    ix = KVIndex()
    names = [f"r{i}" for i in range(12)]
    for name in names:
        ix.enable(name)
        held = rng.randrange(0, 9)  # a prefix of the prompt, then stray blocks
        media = ["device", "host", "disk"]
        ix.apply(name, [stored(range(held), rng.choice(media)), stored(range(7, 12), "host")])
        if held > 2 and rng.random() < 0.5:
            ix.apply(name, [removed([held // 2])])  # a hole: the walk stops there
    for prompt in ([], [0], list(range(12)), [5, 6, 7], [0, 1, 99, 3]):
        want = {name: ix.tiers(name, prompt) for name in names}
        assert ix.tiers_of(names, prompt) == want
        assert ix.tiers_of(names[:3] + ["unknown"], prompt) == {
            **{n: want[n] for n in names[:3]},
            "unknown": [],
        }
    assert any(len(t) > 3 for t in ix.tiers_of(names, list(range(12))).values())


def test_disable_purges_and_ignores_late_events():
    ix = KVIndex()
    ix.enable("a")
    ix.apply("a", [stored(range(10))])
    assert ix.disable("a") == 10
    assert ix.size("a") == 0 and ix.holders(3) == {}
    ix.apply("a", [stored([1])])  # a late event from the dead replica
    assert ix.size("a") == 0 and "a" not in ix.replicas()
    ix.enable("a")
    ix.apply("a", [stored([1])])
    assert ix.tiers("a", [1]) == [DEVICE]


def test_unknown_medium_counts_as_device():
    ix = KVIndex()
    ix.enable("a")
    ix.apply("a", [["BlockStored", [7], None, [], 16, None, None], ["BlockStored", [8], None, [], 16, None, "GPU"]])  # fmt: skip
    assert ix.tiers("a", [7, 8]) == [DEVICE, DEVICE]


def test_approx_prefix_and_ttl():
    ap = ApproxIndex()
    ap.record("a", [1, 2, 3], ttl_s=10, now=0)
    assert ap.prefix("a", [1, 2, 3, 4], now=5) == 3
    assert ap.prefix("a", [2, 3], now=5) == 2
    assert ap.prefix("a", [9, 1], now=5) == 0
    assert ap.prefix("b", [1], now=5) == 0
    assert ap.prefix("a", [1, 2], now=11) == 0  # expired
    ap.record("a", [1], ttl_s=10, now=10)  # refreshed
    assert ap.prefix("a", [1, 2], now=15) == 1
    assert ap.size("a", now=15) == 1
    ap.clear("a")
    assert ap.prefix("a", [1], now=15) == 0


def test_approx_is_bounded():
    ap = ApproxIndex(max_blocks_per_replica=100)
    ap.record("a", range(150), ttl_s=10, now=0)
    assert ap.size("a", now=1) == 100
    assert ap.prefix("a", [149], now=1) == 1 and ap.prefix("a", [0], now=1) == 0
