"""Shared by the cluster tests: a `tokenmill cluster` process (local or on Ray), the
reference outputs of one local replica at temperature 0, and a load generator whose every
request has a client timeout (running out of it is a hang, and fails the test)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tokenmill.router.cluster import free_port, start_cluster, stop_cluster

MODEL = "SmolLM2-135M-Instruct"
ENGINE = ["--kv-cache-memory", "0.1", "--max-num-seqs", "16"]
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colors are",
    "To make a cup of tea, first",
    "The largest planet in our solar system",
    # several KV blocks each: a prefill worker has whole blocks to send
    "Summarize the following notes. " + "The river rose after three days of rain. " * 8,
    "Translate to French, line by line. " + "The harbor lights were blue tonight. " * 8,
]
MAX_TOKENS = 8
REQUEST_TIMEOUT_S = 60.0  # a request still open after this has hung


def body(i: int, stream: bool) -> dict:
    return {"model": MODEL, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": MAX_TOKENS,
            "temperature": 0, "stream": stream}  # fmt: skip


@dataclass
class RunningCluster:
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

    def scale(self, n: int) -> None:
        """`tokenmill cluster scale --replicas n`, as a user would."""
        cmd = [sys.executable, "-m", "tokenmill.cli", "cluster", "scale", "--url", self.url,
               "--replicas", str(n)]  # fmt: skip
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr + r.stdout
        assert self.serving(n), self.replicas()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


def start_tokenmill_cluster(
    args: list[str], log_dir: Path, reference: dict[str, str], n: int, timeout_s: float = 240.0
) -> RunningCluster:
    """`tokenmill cluster ARGS` with the test engine flags; returns once n workers serve."""
    port = free_port()
    log_path = log_dir / f"cluster-{port}.out"
    cmd = [
        sys.executable, "-m", "tokenmill.cli", "--log-level", "INFO", "cluster", *args,
        "--port", str(port), "--health-interval", "0.5", *ENGINE,
    ]  # fmt: skip
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    c = RunningCluster(proc, f"http://127.0.0.1:{port}", log_path, reference)
    try:
        c.wait(lambda: c.serving(n), timeout_s, f"{n} workers serving")
    except BaseException:
        c.stop()
        raise
    return c


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


def under_load(c: RunningCluster, action, settle_s: float = 3.0) -> list[Outcome]:
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


def assert_matches_reference(c: RunningCluster, outcomes: list[Outcome]) -> None:
    for o in outcomes:
        if o.ok:
            assert o.text == c.reference[PROMPTS[o.i % len(PROMPTS)]], o


async def single(url: str, i: int, stream: bool) -> Outcome:
    async with httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S + 5) as client:
        return await one_request(client, i, stream)
