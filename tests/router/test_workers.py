"""Prompts are rendered, tokenized and hashed off the event loop, a bounded number at once."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest

from tests.router.fakes import OK_JSON, serve
from tokenmill.router.prompts import PromptHasher, RequestKey
from tokenmill.router.workers import CPUWorkers

pytestmark = pytest.mark.anyio


class BlockingHasher(PromptHasher):
    """Hashes for real, but first waits until the test lets it go."""

    def __init__(self) -> None:
        super().__init__(None, None)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()

    def key(self, endpoint: str, body: dict, *args, **kwargs) -> RequestKey:
        self.entered.set()
        self.release.wait(5)
        try:
            return super().key(endpoint, body, *args, **kwargs)
        finally:
            self.finished.set()


async def test_health_answers_while_a_large_prompt_is_hashed():
    hasher = BlockingHasher()
    seen: list[int] = []

    def handler(name, request):
        seen.append(len(request.content))
        return httpx.Response(200, json=OK_JSON)

    async with serve(handler, hasher=hasher) as fake:
        prompt = list(range(100_000, 100_000 + 430_000))  # ~3.4 MB of JSON
        big = asyncio.create_task(
            fake.client.post("/v1/completions", json={"model": "m", "prompt": prompt})
        )
        assert await asyncio.to_thread(hasher.entered.wait, 10)
        health = await fake.client.get("/health")
        info = await fake.client.get("/router_info")
        # both answered while the hasher was still held: it does not run on the event loop
        assert health.status_code == 200 and info.status_code == 200
        assert not hasher.finished.is_set()
        hasher.release.set()
        r = await big
        assert r.status_code == 200 and seen[-1] > 3_000_000


async def test_workers_bound_concurrency_even_when_callers_leave():
    workers = CPUWorkers(2)
    gate = threading.Event()
    lock = threading.Lock()
    running = [0, 0]  # now, peak

    def job() -> int:
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
        gate.wait(5)
        with lock:
            running[0] -= 1
        return 7

    tasks = [asyncio.create_task(workers.run(job)) for _ in range(5)]
    await asyncio.sleep(0.1)
    assert running == [2, 2]
    tasks[0].cancel()  # its caller leaves; its thread cannot be stopped
    await asyncio.sleep(0.1)
    assert running == [2, 2]  # so its slot stays taken until the job ends
    gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError) and results[1:] == [7] * 4
    for _ in range(100):  # the abandoned job's thread ends on its own, maybe a moment later
        if running[0] == 0:
            break
        await asyncio.sleep(0.01)
    assert running == [0, 2]
    workers.close()


class BrokenHasher(PromptHasher):
    def key(self, endpoint: str, body: dict, session: str | None = None) -> RequestKey:
        raise RuntimeError("tokenizer bug")


async def test_a_failing_hasher_routes_by_load_instead_of_failing_the_request():
    async with serve(
        lambda n, r: httpx.Response(200, json=OK_JSON), hasher=BrokenHasher(None, None)
    ) as fake:
        r = await fake.client.post("/v1/completions", json={"model": "m", "prompt": [1, 2]})
        assert r.status_code == 200 and fake.in_flight() == 0
