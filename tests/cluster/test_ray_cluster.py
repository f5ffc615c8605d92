"""`tokenmill cluster --ray ADDRESS` on a real local Ray cluster the tests start: a head and
a second node process on this machine, one replica placed on each (STRICT_SPREAD).

Outputs at temperature 0 are compared with a single local replica's. Under load, every
request must complete (or, only where a replica is killed, end with a clean error) and none
may hang: each has a client timeout, and running out of it fails the test."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tokenmill.router.cluster import free_port, start_cluster, stop_cluster

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster as RayCluster  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
ENGINE = ["--kv-cache-memory", "0.1", "--max-num-seqs", "16"]
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colors are",
    "To make a cup of tea, first",
    "The largest planet in our solar system",
]
MAX_TOKENS = 8
REQUEST_TIMEOUT_S = 60.0  # a request still open after this has hung


def body(i: int, stream: bool) -> dict:
    return {"model": MODEL, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": MAX_TOKENS,
            "temperature": 0, "stream": stream}  # fmt: skip


@dataclass
class RayTokenmill:
    proc: subprocess.Popen
    url: str
    log_path: Path
    reference: dict[str, str]  # prompt -> a single local replica's text at temperature 0

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def workers(self) -> list[dict]:
        return httpx.get(self.url + "/cluster", timeout=10).json()["workers"]

    def replicas(self) -> list[dict]:
        return httpx.get(self.url + "/router_info", timeout=10).json()["replicas"]

    def wait(self, what, timeout_s: float = 120.0, message: str = "") -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log()[-5000:]
            try:
                if what():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"timed out: {message}\n{self.log()[-5000:]}")

    def serving(self, n: int) -> bool:
        """n workers ready, and exactly their replicas routed to: healthy and synced."""
        workers = [w for w in self.workers() if w["status"] == "ready" and not w["leaving"]]
        replicas = self.replicas()
        return (
            len(workers) == n == len(replicas)
            and {w["replica"] for w in workers} == {r["name"] for r in replicas}
            and all(r["healthy"] and r["events"] == "synced" for r in replicas)
        )


def reference_outputs(log_dir: Path) -> dict[str, str]:
    [replica] = start_cluster(1, ENGINE, log_dir, threads=1)
    try:
        out = {}
        for p in PROMPTS:
            r = httpx.post(replica.spec.url + "/v1/completions", json=body(0, False) | {"prompt": p},
                           timeout=REQUEST_TIMEOUT_S)  # fmt: skip
            assert r.status_code == 200, r.text
            out[p] = r.json()["choices"][0]["text"]
        return out
    finally:
        stop_cluster([replica])


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory) -> Iterator[RayTokenmill]:
    log_dir = tmp_path_factory.mktemp("ray")
    reference = reference_outputs(log_dir)
    t0 = time.monotonic()
    nodes = RayCluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "object_store_memory": 80 << 20,
                        "include_dashboard": False},
    )  # fmt: skip
    proc = None
    try:
        nodes.add_node(num_cpus=2, object_store_memory=80 << 20)
        nodes.wait_for_nodes()
        print(f"ray head + node up in {time.monotonic() - t0:.1f}s")
        port = free_port()
        log_path = log_dir / "cluster.out"
        cmd = [
            sys.executable, "-m", "tokenmill.cli", "--log-level", "INFO", "cluster",
            "--ray", nodes.address, "--ray-strategy", "STRICT_SPREAD", "--ray-memory", "0.5",
            "--replicas", "2", "--num-threads", "1", "--port", str(port),
            "--health-interval", "0.5", *ENGINE,
        ]  # fmt: skip
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
        c = RayTokenmill(proc, f"http://127.0.0.1:{port}", log_path, reference)
        t1 = time.monotonic()
        c.wait(lambda: c.serving(2), 240, "2 Ray replicas serving")
        print(f"tokenmill cluster --ray: 2 replicas serving in {time.monotonic() - t1:.1f}s "
              f"(actors ready in {[w['ready_s'] for w in c.workers()]} s)")  # fmt: skip
        yield c
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        nodes.shutdown()


# ---------------------------------------------------------------- load


@dataclass
class Outcome:
    i: int
    stream: bool
    status: int | str  # HTTP status, or "hung" / an exception name
    text: str = ""
    error: dict | None = None
    done: bool = False  # a stream's `data: [DONE]`
    replica: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and (self.done or not self.stream)


async def one_request(client: httpx.AsyncClient, i: int, stream: bool) -> Outcome:
    out = Outcome(i, stream, "hung")
    try:
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            if not stream:
                r = await client.post("/v1/completions", json=body(i, False))
                out.status = r.status_code
                out.replica = r.headers.get("x-tokenmill-replica")
                data = r.json()
                if r.status_code == 200:
                    out.text = data["choices"][0]["text"]
                else:
                    out.error = data["error"]
                return out
            async with client.stream("POST", "/v1/completions", json=body(i, True)) as r:
                out.status = r.status_code
                out.replica = r.headers.get("x-tokenmill-replica")
                if r.status_code != 200:
                    out.error = json.loads(await r.aread())["error"]
                    return out
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        out.done = True
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        out.error = chunk["error"]
                    else:
                        out.text += chunk["choices"][0]["text"]
    except TimeoutError:
        out.status = "hung"
    except httpx.HTTPError as e:
        out.status = type(e).__name__
    return out


@dataclass
class Load:
    url: str
    clients: int = 4
    outcomes: list[Outcome] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=REQUEST_TIMEOUT_S + 5) as client:

            async def loop(k: int) -> None:
                n = k
                while not stop.is_set():
                    self.outcomes.append(await one_request(client, n, stream=n % 2 == 0))
                    n += self.clients

            await asyncio.gather(*(loop(k) for k in range(self.clients)))


def under_load(c: RayTokenmill, action, settle_s: float = 3.0) -> list[Outcome]:
    """Runs `action()` (blocking, in a thread) while clients keep sending requests, then
    keeps the load on for `settle_s` more; returns every request's outcome."""

    async def main() -> list[Outcome]:
        load, stop = Load(c.url), asyncio.Event()
        task = asyncio.create_task(load.run(stop))
        await asyncio.sleep(2.0)
        try:
            await asyncio.to_thread(action)
            await asyncio.sleep(settle_s)
        finally:
            stop.set()
            await asyncio.wait_for(task, REQUEST_TIMEOUT_S + 30)
        return load.outcomes

    return asyncio.run(main())


def assert_matches_reference(c: RayTokenmill, outcomes: list[Outcome]) -> None:
    for o in outcomes:
        if o.ok:
            assert o.text == c.reference[PROMPTS[o.i % len(PROMPTS)]], o


# ---------------------------------------------------------------- tests


def test_replicas_on_both_nodes_serve_like_one_local_replica(ray_cluster):
    c = ray_cluster
    workers = c.workers()
    assert len(workers) == 2 and len({w["node_id"] for w in workers}) == 2, workers
    single = [asyncio.run(_single(c.url, i, stream=i % 3 == 0)) for i in range(len(PROMPTS))]
    outcomes = single + under_load(c, lambda: None, settle_s=1.0)
    assert all(o.ok for o in outcomes), [o for o in outcomes if not o.ok]
    assert_matches_reference(c, outcomes)
    assert {o.replica for o in outcomes} == {w["replica"] for w in workers}  # both nodes


async def _single(url: str, i: int, stream: bool) -> Outcome:
    async with httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S + 5) as client:
        return await one_request(client, i, stream)


@pytest.mark.slow
def test_a_killed_replica_actor_is_restarted_and_rejoins(ray_cluster):
    c = ray_cluster
    c.wait(lambda: c.serving(2), 120, "2 replicas before the kill")
    victim = c.workers()[1]
    timings = {}

    def kill() -> None:
        t0 = time.monotonic()
        os.kill(victim["pid"], signal.SIGKILL)  # the actor's process: a failure, not a stop

        def back() -> bool:
            w = next(w for w in c.workers() if w["id"] == victim["id"])
            names = {r["name"] for r in c.replicas()}
            if "down_s" not in timings and victim["replica"] not in {
                r["name"] for r in c.replicas() if r["healthy"]
            }:
                timings["down_s"] = time.monotonic() - t0
            return (
                w["status"] == "ready" and w["restarts"] == 1 and w["replica"] in names
                and victim["replica"] not in names and c.serving(2)
            )  # fmt: skip

        c.wait(back, 180, "the killed actor restarted and rejoined")
        timings["restart_s"] = time.monotonic() - t0

    outcomes = under_load(c, kill, settle_s=4.0)
    bad = [o for o in outcomes if not o.ok]
    print(f"kill -> out of routing {timings.get('down_s', -1):.1f}s, "
          f"-> restarted and routed again {timings['restart_s']:.1f}s; "
          f"{len(outcomes)} requests, {len(bad)} clean errors")  # fmt: skip
    assert not [o for o in outcomes if o.status == "hung"]
    for o in bad:  # a clean error: the OpenAI envelope, and a stream that ends
        assert o.error is not None and o.error.get("message"), o
        assert o.status in (200, 502, 503), o
        assert not o.stream or o.status != 200 or o.done, o
    assert len(bad) <= 16, bad  # only what was running on the killed replica
    assert_matches_reference(c, outcomes)
    w = next(w for w in c.workers() if w["id"] == victim["id"])
    print(f"restarted actor ready in {w['ready_s']} s")
    restarted = w["replica"]
    # the restarted replica takes requests again (its index rebuilt from its events)
    served = {asyncio.run(_single(c.url, i, stream=False)).replica for i in range(12)}
    assert restarted in served, (restarted, served)
    assert "restarted" in c.log()


@pytest.mark.slow
def test_scale_2_1_2_under_load_loses_no_request(ray_cluster):
    c = ray_cluster
    c.wait(lambda: c.serving(2), 120, "2 replicas before scaling")

    def scale(n: int) -> None:
        cmd = [sys.executable, "-m", "tokenmill.cli", "cluster", "scale", "--url", c.url,
               "--replicas", str(n)]  # fmt: skip
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr + r.stdout
        assert c.serving(n), c.replicas()

    timings = {}

    def two_one_two() -> None:
        t0 = time.monotonic()
        scale(1)
        timings["down_s"] = time.monotonic() - t0
        time.sleep(2.0)
        t0 = time.monotonic()
        scale(2)
        timings["up_s"] = time.monotonic() - t0

    outcomes = under_load(c, two_one_two, settle_s=3.0)
    drained = [line for line in c.log().splitlines() if "draining (" in line]
    print(f"scale 2->1 {timings['down_s']:.1f}s, 1->2 {timings['up_s']:.1f}s; "
          f"{len(outcomes)} requests; {drained[-1:]}")  # fmt: skip
    assert drained, "scale-down did not drain"
    bad = [o for o in outcomes if not o.ok]
    assert not bad, bad
    assert len(outcomes) >= 20
    assert_matches_reference(c, outcomes)
    workers = c.workers()
    assert len({w["node_id"] for w in workers}) == 2, workers  # the freed bundle was reused
