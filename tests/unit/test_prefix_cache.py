"""Prefix caching, tiered offload (host memory, disk), cache salts and KV events."""

from __future__ import annotations

import random
import time

import msgpack
import pytest
import zmq

from tokenmill import LLM, SamplingParams
from tokenmill.kv.block_pool import BlockPool
from tokenmill.kv.hashing import block_hashes, external_hash

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def prompts_with_shared_prefix(n: int, prefix_len: int = 70, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(20, 40000) for _ in range(prefix_len)]
    return [
        prefix + [rng.randrange(20, 40000) for _ in range(rng.randrange(1, 20))] for _ in range(n)
    ]


def generate(llm: LLM, prompts: list[list[int]], salt: str | None = None):
    engine = llm.engine
    ids = []
    for p in prompts:
        rid = engine.new_request_id()
        engine.add_request(rid, {"prompt_token_ids": p}, GREEDY, cache_salt=salt)
        ids.append(rid)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        engine.core.check_invariants()
    return [done[r] for r in ids]


def test_eviction_order_is_lru_and_tail_first():
    evicted = []
    pool = BlockPool(6, on_evict=lambda b: evicted.append(b.block_hash))
    a = pool.allocate(3)  # blocks 0, 1, 2
    b = pool.allocate(2)  # blocks 3, 4
    for i, blk in enumerate(a):
        pool.cache_block(blk, b"a%d" % i)
    for i, blk in enumerate(b):
        pool.cache_block(blk, b"b%d" % i)
    pool.free(list(reversed(a)))  # a finishes first, freed tail-first
    pool.free(list(reversed(b)))
    pool.allocate(6)  # takes the never-used block 5, then cached blocks oldest-first
    assert evicted == [b"a2", b"a1", b"a0", b"b1", b"b0"]
    pool.check_invariants()


def test_hit_reuses_blocks_and_matches_cache_off(tiny_llama_dir):
    prompts = prompts_with_shared_prefix(6)
    off = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.05, enable_prefix_caching=False)
    expected = [o.outputs[0].token_ids for o in generate(off, prompts)]
    on = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.05)
    first = generate(on, prompts[:1])  # a miss
    rest = generate(on, prompts[1:])  # hits on the shared 64-token prefix (4 blocks)
    assert first[0].num_cached_tokens == 0 and all(o.num_cached_tokens == 64 for o in rest)
    assert [o.outputs[0].token_ids for o in first + rest] == expected
    stats = on.engine.core.kv_manager.stats
    assert stats.hits == 64 * 5 and stats.queries == sum(len(p) for p in prompts)


def test_full_prompt_hit_still_computes_last_token(tiny_llama_dir):
    prompt = list(range(500, 564))  # exactly 4 blocks
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.05)
    a = generate(llm, [prompt])[0]
    b = generate(llm, [prompt])[0]
    assert b.num_cached_tokens == 48, "the last block is recomputed so one token remains to run"
    assert a.outputs[0].token_ids == b.outputs[0].token_ids


def test_cache_salt_isolates_tenants(tiny_llama_dir):
    prompt = prompts_with_shared_prefix(1)[0]
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.05)
    engine = llm.engine
    for rid, salt in (("t1", "tenant-1"), ("t2", "tenant-2")):
        engine.add_request(rid, {"prompt_token_ids": prompt}, GREEDY, cache_salt=salt)
    engine.step()  # both prefilled in the same step, holding their blocks
    kv = engine.core.kv_manager
    assert kv.get_block_ids("t1") and not set(kv.get_block_ids("t1")) & set(kv.get_block_ids("t2"))
    while engine.has_unfinished_requests():
        engine.step()
    again = generate(llm, [prompt], salt="tenant-1")[0]
    other = generate(llm, [prompt], salt="tenant-3")[0]
    assert again.num_cached_tokens == (len(prompt) - 1) // 16 * 16 and other.num_cached_tokens == 0
    assert block_hashes(prompt, 16, "a")[0] != block_hashes(prompt, 16, "b")[0]


def _fill_to_evict(llm: LLM, n: int = 8, seed: int = 99) -> None:
    rng = random.Random(seed)
    generate(llm, [[rng.randrange(20, 40000) for _ in range(60)] for _ in range(n)])


@pytest.mark.parametrize(
    "tiers,medium",
    [
        ({"kv_offload_memory_gib": 0.05}, "host"),
        ({"kv_offload_disk_gib": 0.05}, "disk"),
        ({"kv_offload_memory_gib": 2.5e-5, "kv_offload_disk_gib": 0.05}, "disk"),
        ({"kv_offload_memory_gib": 2.5e-5, "kv_offload_disk_gib": 0.05, "kv_cache_dtype": "float16"},
         "disk"),  # fmt: skip
    ],
    ids=["host", "disk", "host-demotes-to-disk", "float16-pool"],
)
def test_offloaded_blocks_come_back_from_lower_tiers(tiny_llama_dir, tmp_path, tiers, medium):
    prompt = prompts_with_shared_prefix(1, prefix_len=80)[0]
    dtype = tiers.get("kv_cache_dtype", "auto")
    ref = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.05, enable_prefix_caching=False,
              kv_cache_dtype=dtype)  # fmt: skip
    expected = generate(ref, [prompt])[0].outputs[0].token_ids
    # 12 blocks on the device: other prompts push the first prompt's blocks out
    llm = LLM(str(tiny_llama_dir), num_kv_blocks=12, kv_offload_path=str(tmp_path), **tiers)
    generate(llm, [prompt])
    _fill_to_evict(llm)
    kv = llm.engine.core.kv_manager
    hashes = block_hashes(prompt, 16)
    assert not any(h in kv.pool.cached for h in hashes), "the prompt's blocks left the device"
    back = generate(llm, [prompt])[0]
    assert back.num_cached_tokens == 80
    assert kv.stats.hits_by_medium.get(medium, 0) >= 16
    assert back.outputs[0].token_ids == expected
    for tier in kv.store.tiers:
        assert tier.used <= tier.capacity


def test_corrupted_or_truncated_disk_block_is_recomputed(tiny_llama_dir, tmp_path):
    prompt = prompts_with_shared_prefix(1, prefix_len=80)[0]
    llm = LLM(
        str(tiny_llama_dir),
        num_kv_blocks=12,
        kv_offload_disk_gib=0.05,
        kv_offload_path=str(tmp_path),
    )
    expected = generate(llm, [prompt])[0].outputs[0].token_ids
    _fill_to_evict(llm)
    disk = llm.engine.core.kv_manager.store.disk
    hashes = block_hashes(prompt, 16)
    files = [disk._file(h) for h in hashes]
    assert all(f.exists() for f in files)
    raw = files[1].read_bytes()
    files[1].write_bytes(raw[:-7] + bytes(7 - 1) + b"\x01")  # flipped payload bytes
    files[3].write_bytes(raw[: len(raw) // 2])  # truncated
    back = generate(llm, [prompt])[0]
    assert disk.stats.corrupted == 1, (
        "block 1 fails its checksum (blocks after it are not looked up)"
    )
    assert back.num_cached_tokens == 16  # only block 0 was usable
    assert back.outputs[0].token_ids == expected
    assert not files[1].exists()


def test_disk_full_is_survived(tiny_llama_dir, tmp_path, monkeypatch):
    import errno

    llm = LLM(
        str(tiny_llama_dir),
        num_kv_blocks=12,
        kv_offload_disk_gib=0.05,
        kv_offload_path=str(tmp_path),
    )
    disk = llm.engine.core.kv_manager.store.disk
    real_open = open

    def full_disk(path, mode="r", *a, **k):
        if str(path).endswith(".tmp") and "w" in mode:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode, *a, **k)

    monkeypatch.setattr("builtins.open", full_disk)
    prompt = prompts_with_shared_prefix(1, prefix_len=80)[0]
    first = generate(llm, [prompt])[0]
    _fill_to_evict(llm)
    again = generate(llm, [prompt])[0]
    assert disk.stats.store_failures > 0 and not list(tmp_path.rglob("*.tmp"))
    assert again.outputs[0].token_ids == first.outputs[0].token_ids


def test_kv_events_mirror_engine_and_replay_recovers_gap(tiny_llama_dir, tmp_path):
    pub_ep, replay_ep = f"ipc://{tmp_path}/ev", f"ipc://{tmp_path}/replay"
    llm = LLM(
        str(tiny_llama_dir), num_kv_blocks=12, kv_events_endpoint=pub_ep, kv_events_replay_endpoint=replay_ep,
        kv_offload_memory_gib=0.05,
    )  # fmt: skip
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.connect(pub_ep)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    time.sleep(0.3)  # PUB/SUB join
    generate(llm, prompts_with_shared_prefix(3))
    _fill_to_evict(llm, n=4)
    batches = {}
    while sub.poll(500):
        topic, seq, payload = sub.recv_multipart()
        batches[int.from_bytes(seq, "big")] = msgpack.unpackb(payload)
    assert batches and sorted(batches) == list(range(len(batches)))
    # Drop two batches, as a subscriber that missed them, and recover them through replay.
    missing = sorted(batches)[1:3]
    kept = {s: b for s, b in batches.items() if s not in missing}
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(replay_ep)
    dealer.send_multipart([b"", missing[0].to_bytes(8, "big")])
    while dealer.poll(2000):
        _, seq, payload = dealer.recv_multipart()
        if not payload:
            break
        kept.setdefault(int.from_bytes(seq, "big"), msgpack.unpackb(payload))
    assert kept == batches
    # Replaying the stream gives exactly the blocks each tier holds now.
    held: dict[str, set[int]] = {"device": set(), "host": set()}
    for seq in sorted(kept):
        _ts, events = kept[seq]
        for ev in events:
            if ev[0] == "BlockStored":
                held[ev[6]].update(ev[1])
            elif ev[0] == "BlockRemoved":
                held[ev[2]].difference_update(ev[1])
            else:
                held = {k: set() for k in held}
    kv = llm.engine.core.kv_manager
    assert held["device"] == {external_hash(h) for h in kv.pool.cached}
    assert held["host"] == {external_hash(h) for h in kv.store.host.blocks}
    assert llm.engine.core.reset_prefix_cache()
    _, seq, payload = sub.recv_multipart()
    assert msgpack.unpackb(payload)[1][-1] == ["AllBlocksCleared"]
    llm.engine.core.shutdown()
    ctx.destroy(linger=0)
