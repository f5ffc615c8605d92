"""KV transfer between a prefill and a decode engine core (in one process, the tiny model):
identical outputs and KV values over TCP and shared memory, block accounting on both sides,
leases, and every failure (corrupted frame, aborted prefill, gone prefill worker, unknown
transfer, hostile messages) ending in a recompute or a clean error."""

from __future__ import annotations

import random
import threading
import time

import msgpack
import pytest
import torch
import zmq

from tokenmill.config import CacheConfig, EngineConfig, KVTransferConfig, ModelConfig
from tokenmill.engine.core import EngineCore
from tokenmill.kv.connector.params import KVTransferParams
from tokenmill.kv.connector.wire import PullRequest, unpack_header
from tokenmill.kv.hashing import block_hashes
from tokenmill.messages import EngineCoreRequest
from tokenmill.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
ONE = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)


def make_core(
    model_dir, role: str = "both", blocks: int = 96, cache_dtype: str = "auto", **kv
) -> EngineCore:
    return EngineCore(
        EngineConfig(
            model_config=ModelConfig(model=str(model_dir)),
            cache_config=CacheConfig(num_blocks_override=blocks, cache_dtype=cache_dtype),
            kv_transfer_config=KVTransferConfig(role=role, **kv),
            num_threads=1,
            warm_up=False,
        )
    )


@pytest.fixture
def cores(tiny_llama_dir):
    made: list[EngineCore] = []

    def make(role: str = "both", **kv) -> EngineCore:
        made.append(make_core(tiny_llama_dir, role, **kv))  # kv: cache_dtype, transfer settings
        return made[-1]

    yield make
    for core in made:
        core.shutdown()


def prompt(n: int = 300, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(20, 900) for _ in range(n)]


def add(core, rid, ids, params=GREEDY, kv=None):
    core.add_request(EngineCoreRequest(rid, ids, params, time.monotonic(), kv_transfer_params=kv))


def run(*cores, until, timeout: float = 30.0) -> dict[str, list]:
    """Steps every core until `until(outputs)`; checks block accounting after each step."""
    outs: dict[str, list] = {}
    deadline = time.monotonic() + timeout
    while not until(outs):
        assert time.monotonic() < deadline, f"no progress: {outs}"
        for core in cores:
            for o in core.step().outputs:
                entry = outs.setdefault(o.request_id, [[], None, None])
                entry[0] += o.new_token_ids
                if o.finish_reason:
                    entry[1], entry[2] = o.finish_reason, o.stop_reason
            core.check_invariants()
        time.sleep(0.002)
    return outs


def finished(*rids):
    return lambda outs: all(r in outs and outs[r][1] for r in rids)


def reference(cores, ids, params=GREEDY) -> list[int]:
    both = cores("both")
    add(both, "ref", ids, params)
    return run(both, until=finished("ref"))["ref"][0]


def remote(tid: str, prefill: EngineCore) -> dict:
    return {"do_remote_prefill": True, "transfer_id": tid,
            "remote_endpoint": prefill.kv_connector.server.endpoint}  # fmt: skip


def lease_ended(prefill: EngineCore):
    return lambda outs: not prefill.kv_connector.producer.active


@pytest.mark.parametrize("carrier", ["tcp", "shm"])
def test_decode_worker_gets_the_prefill_workers_kv_exactly(cores, carrier):
    ids = prompt(300)
    expected = reference(cores, ids)
    prefill, decode = cores("prefill"), cores("decode", carrier=carrier, chunk_blocks=4)
    add(prefill, "p", ids, ONE, {"do_remote_decode": True, "transfer_id": "t1"})
    add(decode, "d", ids, GREEDY, remote("t1", prefill))
    outs = run(prefill, decode, until=lambda o: finished("p", "d")(o) and lease_ended(prefill)(o))
    assert outs["d"][0] == expected and outs["d"][1] == "length"
    n = (len(ids) - 1) // 16
    stats = decode.kv_connector.stats
    assert stats.blocks_received == n and stats.transfers_received == 1 and not stats.failures
    assert prefill.kv_connector.stats.transfers_served == 1
    # the decode worker computed no prompt block itself: its KV is the prefill worker's, bit for bit
    for h in block_hashes(ids[: n * 16], 16):
        pb, db = prefill.kv_manager.pool.lookup(h), decode.kv_manager.pool.lookup(h)
        assert torch.equal(
            prefill.runner.read_block(pb.block_id), decode.runner.read_block(db.block_id)
        )
    # everything went back: the lease ended (blocks to the prefix cache), nothing in use
    for core in (prefill, decode):
        assert core.kv_manager.pool.num_used_blocks == 0
        assert core.block_accounting()["invariant_violation"] is None


def test_a_float16_decode_worker_stores_a_float32_prefill_workers_kv_rounded(cores):
    """--kv-cache-dtype float16 on the decode worker only: the received float32 blocks go
    into its pool rounded to float16, as its own writes are."""
    ids = prompt(100)
    prefill, decode = cores("prefill"), cores("decode", cache_dtype="float16")
    add(prefill, "p", ids, ONE, {"do_remote_decode": True, "transfer_id": "t1"})
    add(decode, "d", ids, GREEDY, remote("t1", prefill))
    outs = run(prefill, decode, until=lambda o: finished("p", "d")(o) and lease_ended(prefill)(o))
    assert outs["d"][1] == "length" and decode.kv_connector.stats.blocks_received == 6
    for h in block_hashes(ids[:96], 16):
        pb, db = prefill.kv_manager.pool.lookup(h), decode.kv_manager.pool.lookup(h)
        got = decode.runner.read_block(db.block_id)
        assert got.dtype == torch.float16
        assert torch.equal(got, prefill.runner.read_block(pb.block_id).half())


def test_only_the_missing_blocks_travel_and_usage_counts_local_hits_only(cores):
    ids = prompt(300)
    prefill, decode = cores("prefill"), cores("decode")
    add(decode, "warm", ids[:100], GREEDY)  # the decode worker holds the first 6 blocks
    run(decode, until=finished("warm"))
    add(prefill, "p", ids, ONE, {"do_remote_decode": True, "transfer_id": "t"})
    add(decode, "d", ids, GREEDY, remote("t", prefill))
    run(prefill, decode, until=lambda o: finished("p", "d")(o) and lease_ended(prefill)(o))
    assert decode.kv_connector.stats.blocks_received == (len(ids) - 1) // 16 - 6
    req_cached = decode.kv_manager.stats  # prefix-cache stats count local hits only
    assert req_cached.hits == 16 * 6


def test_pull_waits_for_a_prefill_that_starts_later_and_arrives_chunk_by_chunk(cores):
    ids = prompt(600, seed=3)
    expected = reference(cores, ids)
    prefill = cores("prefill")
    decode = cores("decode", chunk_blocks=2)
    add(decode, "d", ids, GREEDY, remote("late", prefill))  # before the prefill exists
    run(decode, until=lambda o: decode.kv_connector.num_parked == 1, timeout=5)
    add(prefill, "p", ids, ONE, {"do_remote_decode": True, "transfer_id": "late"})
    outs = run(prefill, decode, until=finished("p", "d"))
    assert outs["d"][0] == expected
    assert decode.kv_connector.stats.blocks_received == (len(ids) - 1) // 16


def test_pulls_waiting_on_long_prefills_do_not_hold_back_a_ready_one(cores):
    """Many transfers waiting on their prompts' prefill (long prompts on a CPU) leave room
    for a short prompt's blocks, already computed, to be pulled at once (4 pull slots once
    held it until a waiting transfer ended)."""
    prefill, decode = cores("prefill"), cores("decode")
    waiting = [f"w{i}" for i in range(8)]
    for i, rid in enumerate(waiting):  # their prefills have not started
        add(decode, rid, prompt(40, seed=10 + i), GREEDY, remote(f"slow-{i}", prefill))
    run(decode, until=lambda o: decode.kv_connector.num_parked == len(waiting), timeout=5)
    ids = prompt(120, seed=4)
    expected = reference(cores, ids)
    add(prefill, "p", ids, ONE, {"do_remote_decode": True, "transfer_id": "ready"})
    add(decode, "d", ids, GREEDY, remote("ready", prefill))
    outs = run(prefill, decode, until=finished("p", "d"), timeout=20)
    assert outs["d"][0] == expected and decode.kv_connector.stats.blocks_received > 0
    decode.abort_requests(waiting)
    assert decode.kv_connector.num_parked == 0


class CorruptingProxy:
    """A man in the middle between the decode and the prefill worker that flips one byte
    of the first block payload it forwards."""

    def __init__(self, upstream: str) -> None:
        self.ctx = zmq.Context()
        self.front = self.ctx.socket(zmq.ROUTER)
        port = self.front.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.back = self.ctx.socket(zmq.DEALER)
        self.back.connect(upstream)
        self.flipped = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        peer = None
        while not self.stop.is_set():
            if self.front.poll(10):
                frames = self.front.recv_multipart()
                peer = frames[0]
                self.back.send_multipart(frames[1:])
            if self.back.poll(10):
                frames = self.back.recv_multipart()
                if len(frames) > 1 and not self.flipped:
                    payload = bytearray(frames[2])
                    payload[len(payload) // 2] ^= 0x40
                    frames[2] = bytes(payload)
                    self.flipped += 1
                self.front.send_multipart([peer, *frames])

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.ctx.destroy(linger=0)


def test_a_corrupted_transfer_is_detected_and_recomputed(cores):
    ids = prompt(300, seed=5)
    expected = reference(cores, ids)
    prefill, decode = cores("prefill"), cores("decode", carrier="tcp")
    proxy = CorruptingProxy(prefill.kv_connector.server.endpoint)
    try:
        add(prefill, "p", ids, ONE, {"do_remote_decode": True, "transfer_id": "c"})
        add(decode, "d", ids, GREEDY,
            {"do_remote_prefill": True, "transfer_id": "c", "remote_endpoint": proxy.endpoint})  # fmt: skip
        outs = run(
            prefill, decode, until=lambda o: finished("p", "d")(o) and lease_ended(prefill)(o)
        )
    finally:
        proxy.close()
    assert proxy.flipped == 1
    assert outs["d"][0] == expected  # recomputed, not loaded from bad bytes
    stats = decode.kv_connector.stats
    assert stats.failures == {"checksum": 1} and stats.fallbacks == 1 and stats.blocks_received == 0
    for core in (prefill, decode):  # the failed load let the prefill worker's lease go too
        assert core.kv_manager.pool.num_used_blocks == 0


def test_an_aborted_prefill_fails_the_transfer_and_the_decode_recomputes(cores):
    ids = prompt(400, seed=7)
    expected = reference(cores, ids)
    prefill, decode = cores("prefill"), cores("decode")
    add(prefill, "p", ids, ONE, {"do_remote_decode": True, "transfer_id": "ab"})
    add(decode, "d", ids, GREEDY, remote("ab", prefill))
    prefill.abort_requests(["p"])  # before any block is computed
    outs = run(prefill, decode, until=finished("d"))
    assert outs["d"][0] == expected
    assert decode.kv_connector.stats.failures == {"failed": 1}
    assert prefill.kv_connector.stats.transfers_dropped == 1
    assert prefill.kv_manager.pool.num_used_blocks == 0


def test_a_gone_prefill_worker_and_an_unknown_transfer_end_in_recompute(cores, monkeypatch):
    from tokenmill.kv.connector import client

    monkeypatch.setattr(client, "SILENCE_S", 0.5)
    ids = prompt(200, seed=9)
    expected = reference(cores, ids)
    decode = cores("decode")
    with zmq.Context() as ctx:  # a port that accepts nothing
        s = ctx.socket(zmq.ROUTER)
        port = s.bind_to_random_port("tcp://127.0.0.1")
        s.close(linger=0)
    add(decode, "gone", ids, GREEDY,
        {"do_remote_prefill": True, "transfer_id": "x", "remote_endpoint": f"tcp://127.0.0.1:{port}"})  # fmt: skip
    outs = run(decode, until=finished("gone"))
    assert outs["gone"][0] == expected
    assert decode.kv_connector.stats.failures == {"unreachable": 1}


def test_fail_policy_fails_the_request_cleanly(cores, monkeypatch):
    from tokenmill.kv.connector import client

    monkeypatch.setattr(client, "SILENCE_S", 0.3)
    decode = cores("decode", load_failure_policy="fail")
    add(decode, "d", prompt(100), GREEDY,
        {"do_remote_prefill": True, "transfer_id": "x", "remote_endpoint": "tcp://127.0.0.1:9"})  # fmt: skip
    outs = run(decode, until=finished("d"))
    assert outs["d"][1] == "error" and "KV load failed: unreachable" in outs["d"][2]
    assert decode.kv_manager.pool.num_used_blocks == 0 and not decode.kv_connector.num_parked


def test_an_unconfirmed_lease_expires_and_frees_its_blocks(cores):
    prefill = cores("prefill", lease_timeout_s=0.3)
    add(prefill, "p", prompt(200), ONE, {"do_remote_decode": True, "transfer_id": "nobody"})
    run(prefill, until=finished("p"))
    acct = prefill.block_accounting()
    assert acct["leased_blocks"] == acct["used_blocks"] > 0  # held for the puller
    run(prefill, until=lease_ended(prefill), timeout=5)
    assert prefill.kv_manager.pool.num_used_blocks == 0
    assert prefill.kv_connector.stats.leases_expired == 1
    # the freed blocks stayed in the prefix cache: the same prompt hits them
    add(prefill, "again", prompt(200), ONE)
    run(prefill, until=finished("again"))
    assert prefill.kv_manager.stats.hits >= 16 * 12


def test_aborting_a_parked_request_cancels_its_pull(cores):
    prefill, decode = cores("prefill"), cores("decode")
    add(decode, "d", prompt(200), GREEDY, remote("never-registered", prefill))
    run(decode, until=lambda o: decode.kv_connector.num_parked == 1, timeout=5)
    decode.abort_requests(["d"])
    assert decode.kv_connector.num_parked == 0 and not decode.has_unfinished_requests()
    time.sleep(0.3)
    assert run(decode, until=lambda o: True) == {}  # nothing comes back for it


@pytest.mark.parametrize(
    "params, role, message",
    [
        ({"do_remote_decode": True, "transfer_id": "a"}, "both", "role both"),
        ({"do_remote_prefill": True, "transfer_id": "a", "remote_endpoint": "tcp://h:1"},
         "prefill", "not a decode worker"),
        ({"do_remote_decode": True, "transfer_id": "a"}, "decode", "not a prefill worker"),
        ({"do_remote_decode": True, "do_remote_prefill": True, "transfer_id": "a"}, "decode",
         "exactly one"),
        ({"do_remote_prefill": True, "transfer_id": "a", "remote_endpoint": "http://x:1"},
         "decode", "remote_endpoint"),
        ({"do_remote_decode": True, "transfer_id": "a b"}, "prefill", "transfer_id"),
        ({"do_remote_decode": True, "transfer_id": "a", "extra": 1}, "prefill", "unknown field"),
        ({"do_remote_decode": "yes", "transfer_id": "a"}, "prefill", "boolean"),
        ([], "prefill", "object"),
    ],
)  # fmt: skip
def test_bad_transfer_params_are_refused(cores, params, role, message):
    core = cores(role)
    with pytest.raises(ValueError, match=message):
        add(core, "r", prompt(50), GREEDY, params)
    assert not core.has_unfinished_requests()


def test_a_transfer_id_is_used_once(cores):
    prefill = cores("prefill")
    add(prefill, "p1", prompt(50), ONE, {"do_remote_decode": True, "transfer_id": "dup"})
    with pytest.raises(ValueError, match="already in use"):
        add(prefill, "p2", prompt(50), ONE, {"do_remote_decode": True, "transfer_id": "dup"})
    assert list(prefill.scheduler.requests) == ["p1"]


def test_the_block_server_survives_hostile_messages(cores):
    prefill = cores("prefill")
    add(prefill, "p", prompt(100), ONE, {"do_remote_decode": True, "transfer_id": "ok"})
    run(prefill, until=finished("p"))
    with zmq.Context() as ctx:
        s = ctx.socket(zmq.DEALER)
        s.connect(prefill.kv_connector.server.endpoint)
        bad = [
            [b"PULL", b"\xc1\xff"],  # not msgpack
            [b"PULL", msgpack.packb([1, 2])],  # not a map
            [b"PULL", msgpack.packb({"transfer_id": "ok", "start": -1, "max_blocks": 1, "carrier": "tcp"})],
            [b"PULL", msgpack.packb({"transfer_id": "ok", "start": 0, "max_blocks": 10**9, "carrier": "tcp"})],
            [b"PULL", msgpack.packb({"transfer_id": "ok", "start": 0, "max_blocks": 1, "carrier": "rdma"})],
            [b"PULL", msgpack.packb({"transfer_id": "x" * 500, "start": 0, "max_blocks": 1})],
            [b"NOPE", msgpack.packb({"transfer_id": "ok"})],
            [b"PULL", b"a" * 5000],  # oversized
        ]  # fmt: skip
        for frames in bad:
            s.send_multipart(frames)
            assert s.poll(2000), frames
            header = unpack_header(s.recv_multipart()[0])
            assert header["status"] == "failed" and "bad request" in header["reason"]
        s.send_multipart([b"garbage"])  # wrong frame count: dropped, no reply
        s.send_multipart(PullRequest("ok", 0, 2, "tcp").encode())
        assert s.poll(2000)
        frames = s.recv_multipart()
        header = unpack_header(frames[0])
        assert header["status"] == "blocks" and len(header["hashes"]) == 2
        assert len(frames) == 1 + header["layers"]  # the header, then a slice per layer
        s.close(linger=0)


def test_params_round_trip():
    p = KVTransferParams.from_json(
        {"do_remote_prefill": True, "transfer_id": "t", "remote_endpoint": "tcp://[::1]:5"}
    )
    assert KVTransferParams.from_json(p.to_json()) == p
