"""Two real replicas behind a real router: tokenization parity, prefix placement, burst
spread, event-gap recovery on a real stream, and (last) a replica killed under load."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections import Counter, defaultdict

import httpx

from tests.router.conftest import MODEL
from tokenmill.router.index import KVIndex
from tokenmill.router.prompts import PromptHasher
from tokenmill.router.subscriber import EventSubscriber

WORDS = "river mountain ledger invoice orbit copper lantern harbor meadow signal quartz velvet"
WORDS += " canyon ember garnet falcon willow cobalt prism tundra"


def system_prompt(tenant: str, n_words: int = 260) -> str:
    rng = random.Random(tenant)
    return f"You are the assistant of {tenant}. Rules: " + " ".join(
        rng.choice(WORDS.split()) for _ in range(n_words)
    )


def chat(tenant: str, question: str, **extra) -> dict:
    return {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": system_prompt(tenant)},
            {"role": "user", "content": question},
        ],
        "max_tokens": 4,
        "temperature": 0,
        **extra,
    }


def post(url: str, body: dict) -> httpx.Response:
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r


def test_router_tokenizes_and_hashes_like_the_engine(cluster):
    hasher = PromptHasher.from_model(None)
    replica = cluster.replicas[0].spec.url
    body = chat("acme", "What is the refund policy?")
    key = hasher.key("chat", body)
    engine = httpx.post(replica + "/tokenize", json={"messages": body["messages"]}).json()
    assert list(key.token_ids) == engine["tokens"]
    text = "Once upon a time <|im_start|> there was"
    key = hasher.key("completions", {"model": MODEL, "prompt": text})
    engine = httpx.post(replica + "/tokenize", json={"prompt": text}).json()
    assert list(key.token_ids) == engine["tokens"]

    # the blocks the replica reports through events are the ones the router computes
    r = post(cluster.url, chat("hash-check", "Hi", cache_salt="tenant-7"))
    name = r.headers["x-tokenmill-replica"]
    key = hasher.key("chat", chat("hash-check", "Hi", cache_salt="tenant-7"))
    hashes = key.hashes(16)
    sub_index = KVIndex()
    sub_index.enable(name)
    spec = next(p.spec for p in cluster.replicas if p.spec.name == name)
    sub = EventSubscriber(name, sub_index, spec.events, spec.replay)
    sub.start()
    try:
        deadline = time.monotonic() + 10
        while sub.state != "synced" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(sub_index.tiers(name, hashes)) == len(hashes) > 10
        unsalted = hasher.key("chat", chat("hash-check", "Hi")).hashes(16)
        assert sub_index.tiers(name, unsalted) == []  # the salt changes every block
    finally:
        sub.stop()


def test_shared_prefix_lands_on_the_replica_holding_it(cluster):
    placed = defaultdict(list)
    for tenant in ("alpha", "beta"):
        first = post(cluster.url, chat(tenant, "First question?"))
        placed[tenant].append(first.headers["x-tokenmill-replica"])
        assert first.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    for i in range(3):
        for tenant in ("alpha", "beta"):
            r = post(cluster.url, chat(tenant, f"Follow-up number {i}?"))
            placed[tenant].append(r.headers["x-tokenmill-replica"])
            usage = r.json()["usage"]
            # the whole system prompt (all its full blocks) came from the cache
            assert usage["prompt_tokens_details"]["cached_tokens"] >= usage["prompt_tokens"] - 32, (
                usage
            )
    for tenant, names in placed.items():
        assert len(set(names)) == 1, (tenant, names)
    assert "cache_hit" in cluster.log()


def test_burst_of_four_prefixes_spreads_over_both_replicas(cluster):
    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=cluster.url, timeout=120) as client:
            bodies = [chat(f"burst-{i % 4}", f"Question {i}?") for i in range(16)]
            return await asyncio.gather(
                *(client.post("/v1/chat/completions", json=b) for b in bodies)
            )

    responses = asyncio.run(burst())
    assert all(r.status_code == 200 for r in responses)
    where = defaultdict(Counter)
    for i, r in enumerate(responses):
        where[f"burst-{i % 4}"][r.headers["x-tokenmill-replica"]] += 1
    per_replica = Counter(r.headers["x-tokenmill-replica"] for r in responses)
    assert len(per_replica) == 2, where  # not all on one replica
    # Each prefix is computed on one replica, except where the cost model chose to recompute
    # it rather than queue behind a replica with a cold prefill more booked (a margin of one
    # prompt): at most 2 of the 4 prefixes on both. least_load places every prefix on both.
    placements = sum(len(counts) for counts in where.values())
    assert placements <= 6, where


def test_event_gap_recovery_on_a_real_stream(cluster):
    spec = cluster.replicas[0].spec
    index = KVIndex()
    index.enable("r0")
    sub = EventSubscriber("r0", index, spec.events, spec.replay)
    sub.start()
    try:
        deadline = time.monotonic() + 10
        while sub.state != "synced" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sub.state == "synced"
        post(spec.url, chat("gap-warm", "Hi"))  # makes sure the live stream flows
        while sub.stats.batches == sub.stats.replayed and time.monotonic() < deadline:
            time.sleep(0.05)
        first_lost = sub.last_seq + 1
        sub.drop_live = lambda seq: first_lost <= seq < first_lost + 2  # lose two batches
        hasher = PromptHasher.from_model(None)
        for tenant in ("gap-1", "gap-2", "gap-3"):
            post(spec.url, chat(tenant, "Hello?"))
        deadline = time.monotonic() + 10
        while sub.stats.gaps_filled == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sub.stats.gaps >= 1 and sub.stats.gaps_filled >= 1 and sub.state == "synced"
        for tenant in ("gap-1", "gap-2", "gap-3"):
            hashes = hasher.key("chat", chat(tenant, "Hello?")).hashes(16)
            assert len(index.tiers("r0", hashes)) == len(hashes)
        # the recovered index equals one rebuilt from scratch (a full resync)
        fresh = KVIndex()
        fresh.enable("r0")
        check = EventSubscriber("r0", fresh, spec.events, spec.replay)
        check.start()
        try:
            deadline = time.monotonic() + 10
            while check.state != "synced" and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.3)
            assert fresh._held["r0"] == index._held["r0"]
        finally:
            check.stop()
    finally:
        sub.stop()


def test_kill_a_replica_under_load(cluster):
    """24 streams in flight; one replica is SIGKILLed. Every stream completes or, if it
    was mid-stream on the dead replica, ends with an error event and [DONE]; nothing
    hangs; new requests succeed; the dead replica's index entries are gone."""
    results: list[dict] = []
    started: Counter[str] = Counter()

    async def one(client: httpx.AsyncClient, i: int) -> None:
        body = chat(f"load-{i % 10}", f"Tell me a long story number {i}.", max_tokens=32,
                    ignore_eos=True, stream=True)  # fmt: skip
        out = {"i": i, "replica": None, "text": "", "status": None}
        try:
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                out["status"] = r.status_code
                out["replica"] = r.headers.get("x-tokenmill-replica")
                started[out["replica"]] += 1
                async for chunk in r.aiter_text():
                    out["text"] += chunk
        except httpx.HTTPError as e:
            out["exc"] = repr(e)
        results.append(out)

    async def scenario() -> str:
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(base_url=cluster.url, timeout=120, limits=limits) as client:
            tasks = [asyncio.create_task(one(client, i)) for i in range(24)]
            deadline = time.monotonic() + 90
            while min(started.values(), default=0) < 3 or len(started) < 2:
                assert time.monotonic() < deadline, started
                await asyncio.sleep(0.05)
            victim = max(started, key=lambda n: started[n])
            proc = next(p for p in cluster.replicas if p.spec.name == victim)
            os.killpg(proc.proc.pid, signal.SIGKILL)
            await asyncio.wait_for(asyncio.gather(*tasks), 150)  # nothing hangs
            return victim

    victim = asyncio.run(scenario())
    assert len(results) == 24
    completed = errored = 0
    for res in results:
        assert "exc" not in res, res
        assert res["status"] == 200, res
        assert res["text"].endswith("data: [DONE]\n\n"), res
        if '"error"' in res["text"]:
            assert res["replica"] == victim, res  # only streams cut on the dead replica
            errored += 1
        else:
            completed += 1
    assert completed > 0
    # new requests keep succeeding, on the survivor
    survivor = next(p.spec.name for p in cluster.replicas if p.spec.name != victim)
    for i in range(4):
        r = post(cluster.url, chat("after", f"Still there {i}?"))
        assert r.headers["x-tokenmill-replica"] == survivor
    dead = cluster.replica_info(victim)
    assert not dead["healthy"] and sum(dead["index_blocks"].values()) == 0
    assert dead["approx_blocks"] == 0
    assert httpx.get(cluster.url + "/health").status_code == 200
    metrics = httpx.get(cluster.url + "/metrics").text
    assert f'tokenmill:router_replica_healthy{{replica="{victim}"}} 0.0' in metrics
    print(f"kill under load: {completed} completed, {errored} ended with a clean error")
