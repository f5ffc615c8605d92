"""Prefill/decode disaggregation across real processes: a prefill worker and a decode worker
behind the router, against a single plain worker. Same text at temperature 0 (short and long
prompts, prefix hits, streaming, completions, the full context), the decode worker's KV equal
to the prefill worker's, block accounting on both sides, lease expiry, and (last) the prefill
worker killed mid-transfer: the request still completes, recomputed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.router.conftest import MODEL, start_router
from tests.router.test_subscriber import wait_until
from tokenmill.router.cluster import ReplicaProcess, start_cluster, stop_cluster

ARGS = ["--kv-cache-memory", "0.5", "--kv-lease-timeout", "3", "--max-num-batched-tokens", "256"]


@dataclass
class Layout:
    prefill: ReplicaProcess
    decode: ReplicaProcess
    single: ReplicaProcess
    router: subprocess.Popen
    url: str
    log_path: object

    def decisions(self) -> list[dict]:
        out = []
        for line in self.log_path.read_text().splitlines():
            if '{"disaggregation"' in line:
                out.append(json.loads(line[line.index("{") :])["disaggregation"])
        return out


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> Iterator[Layout]:
    log_dir = tmp_path_factory.mktemp("disagg")
    workers = start_cluster(2, ARGS, log_dir, threads=1, log_level="INFO",
                            roles=["prefill", "decode"])  # fmt: skip
    single: list[ReplicaProcess] = []
    router = None
    try:
        single = start_cluster(1, ARGS, log_dir, threads=1, log_level="INFO")
        router, url, log_path = start_router(workers, log_dir, "--pd-min-uncached-tokens", "256")
        yield Layout(workers[0], workers[1], single[0], router, url, log_path)
    finally:
        if router is not None:
            router.terminate()
            router.wait(30)
        stop_cluster(workers + single)


def words(seed: int, n: int) -> str:
    import random

    rng = random.Random(seed)
    vocab = [
        "harbor",
        "ledger",
        "quartz",
        "meadow",
        "falcon",
        "copper",
        "signal",
        "willow",
        "ember",
        "tundra",
        "prism",
    ]
    return " ".join(rng.choice(vocab) for _ in range(n))


def chat_body(content: str, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": 16, "temperature": 0, **extra}  # fmt: skip


def post(url: str, path: str, body: dict, timeout: float = 300) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=timeout)


def text_of(resp: httpx.Response) -> str:
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def streamed_text(url: str, body: dict) -> str:
    parts = []
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True},
                      timeout=300) as r:  # fmt: skip
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[6:])
                assert "error" not in event, event
                if event["choices"]:
                    parts.append(event["choices"][0]["delta"].get("content") or "")
    return "".join(parts)


def kv_cache(r: ReplicaProcess) -> dict:
    return httpx.get(r.spec.url + "/kv_cache", timeout=10).json()


def server_stats(r: ReplicaProcess) -> dict:
    return httpx.get(r.spec.url + "/server_info", timeout=10).json()["kv_transfer_stats"]


def wait_released(*workers: ReplicaProcess, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while any(kv_cache(w)["used_blocks"] for w in workers):
        assert time.monotonic() < deadline, [kv_cache(w) for w in workers]
        time.sleep(0.1)
    for w in workers:
        assert kv_cache(w)["invariant_violation"] is None


def test_outputs_match_a_single_worker(layout):
    single = layout.single.spec.url
    long_chat = chat_body(words(1, 600))
    cases = [
        ("/v1/chat/completions", chat_body("Say hello.")),  # short: the decode worker prefills
        ("/v1/chat/completions", long_chat),  # long: remote prefill
        ("/v1/chat/completions", long_chat),  # the decode worker holds the prefix now: local
        (
            "/v1/completions",
            {"model": MODEL, "prompt": words(2, 700), "max_tokens": 16, "temperature": 0},
        ),  # fmt: skip
    ]
    for path, body in cases:
        assert text_of(post(layout.url, path, body)) == text_of(post(single, path, body))
    stream_body = chat_body(words(3, 500))
    assert streamed_text(layout.url, stream_body) == text_of(
        post(single, "/v1/chat/completions", stream_body)
    )
    remote = [d for d in layout.decisions() if d["remote"]]
    local = [d for d in layout.decisions() if not d["remote"]]
    assert len(remote) == 3 and all(d["uncached_tokens"] >= 256 for d in remote)
    assert len(local) == 2 and all("< 256" in d["reason"] for d in local)
    wait_released(layout.prefill, layout.decode)
    metrics = httpx.get(layout.url + "/metrics").text
    assert 'kv_transfer_decisions_total{decision="remote",reason="long"} 3.0' in metrics

    def served() -> float | None:  # the workers' counters, as the router's last poll read them
        lines = [
            m
            for m in httpx.get(layout.url + "/metrics").text.splitlines()
            if m.startswith("tokenmill:router_kv_transfer_transfers_served_total")
        ]
        return float(lines[0].split()[-1]) if lines else None

    # the router reads each worker's counters on its health poll (1 s): the third release
    # shows up by the next poll after the blocks came back
    wait_until(lambda: served() == 3, timeout=10.0)


def test_the_decode_workers_kv_is_the_prefill_workers(layout):
    body = chat_body(words(4, 400), max_tokens=2)
    text_of(post(layout.url, "/v1/chat/completions", body))
    ids = post(layout.single.spec.url, "/tokenize", {"messages": body["messages"]}).json()["tokens"]
    n = (len(ids) - 1) // 16
    digests = [post(w.spec.url, "/kv_cache/digests", {"token_ids": ids}).json()["digests"][:n]
               for w in (layout.prefill, layout.decode)]  # fmt: skip
    assert all(digests[0]) and digests[0] == digests[1]


@pytest.mark.slow  # two 8k-token prefills on one thread each: minutes on 2 cores
def test_a_full_context_prompt_goes_the_whole_path_and_a_longer_one_is_refused(layout):
    single = layout.single.spec.url
    ids = post(single, "/tokenize", {"prompt": words(5, 9000)}).json()["tokens"]
    body = {"model": MODEL, "prompt": ids[: 8192 - 4], "max_tokens": 4, "temperature": 0}
    assert text_of(post(layout.url, "/v1/completions", body)) == text_of(
        post(single, "/v1/completions", body)
    )
    assert layout.decisions()[-1]["remote"]
    too_long = post(layout.url, "/v1/completions", {**body, "prompt": ids[:8200]})
    assert too_long.status_code == 400 and too_long.json()["error"]["message"]
    wait_released(layout.prefill, layout.decode)


def test_an_unclaimed_lease_expires_and_frees_the_prefill_workers_blocks(layout):
    body = chat_body(words(6, 300), max_tokens=1,
                     kv_transfer_params={"do_remote_decode": True, "transfer_id": "unclaimed"})  # fmt: skip
    text_of(post(layout.prefill.spec.url, "/v1/chat/completions", body))
    held = kv_cache(layout.prefill)
    assert held["leased_blocks"] > 0 and held["used_blocks"] == held["leased_blocks"]
    wait_released(layout.prefill, timeout=8)  # --kv-lease-timeout 3
    deadline = time.monotonic() + 5  # the counters reach the API process within a second
    while server_stats(layout.prefill)["leases_expired"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_a_client_cannot_set_kv_transfer_params_through_the_router(layout):
    body = chat_body("hi", kv_transfer_params={"do_remote_prefill": True, "transfer_id": "x",
                                               "remote_endpoint": "tcp://10.255.255.1:1"})  # fmt: skip
    assert text_of(post(layout.url, "/v1/chat/completions", body)) == text_of(
        post(layout.single.spec.url, "/v1/chat/completions", chat_body("hi"))
    )
    bad = post(layout.decode.spec.url, "/v1/chat/completions",
               chat_body("hi", kv_transfer_params={"do_remote_decode": True, "transfer_id": "y"}))  # fmt: skip
    assert bad.status_code == 400 and "role is decode" in bad.json()["error"]["message"]


def test_malformed_transfer_params_and_digest_bodies_get_400_beside_a_running_request(layout):
    body = chat_body(words(8, 300), max_tokens=24)
    expected = text_of(post(layout.single.spec.url, "/v1/chat/completions", body))
    result: dict = {}
    running = threading.Thread(target=lambda: result.update(text=streamed_text(layout.url, body)))
    running.start()
    deep: dict = {}
    for _ in range(200):
        deep = {"x": deep}
    bad_params = [
        "tcp", [], {}, 5, {"transfer_id": ""},
        {"do_remote_prefill": True, "transfer_id": "t", "remote_endpoint": "tcp://h:99999"},
        {"do_remote_prefill": True, "transfer_id": "t", "remote_endpoint": "tcp://h:-1"},
        {"do_remote_prefill": True, "transfer_id": "x" * 10_000, "remote_endpoint": "tcp://h:1"},
        {"do_remote_prefill": True, "transfer_id": "t", "remote_endpoint": "tcp://h:1", "n": 1},
        {"do_remote_prefill": 1, "transfer_id": "t", "remote_endpoint": "tcp://h:1"},
    ]  # fmt: skip
    for params in bad_params:
        r = post(layout.decode.spec.url, "/v1/chat/completions",
                 chat_body("hi", kv_transfer_params=params), timeout=30)  # fmt: skip
        assert r.status_code == 400 and "kv_transfer_params" in r.text, (params, r.text[:300])
    nested = chat_body("hi", kv_transfer_params={"do_remote_decode": True, "transfer_id": deep})
    r = post(layout.decode.spec.url, "/v1/chat/completions", nested, timeout=30)
    assert r.status_code == 400 and "nested" in r.text, r.text[:300]
    for digest_body in ({"token_ids": [-1]}, {"token_ids": "abc"}, {"token_ids": [[1]]},
                        {"token_ids": [1] * 9000}, {"token_ids": [2**40]}, {}, {"token_ids": deep}):  # fmt: skip
        r = post(layout.decode.spec.url, "/kv_cache/digests", digest_body, timeout=30)
        assert r.status_code == 400, (str(digest_body)[:80], r.text[:300])
    assert post(layout.decode.spec.url, "/kv_cache/digests", {"token_ids": []}).json() == {
        "digests": []
    }
    running.join(120)
    assert result["text"] == expected
    for w in (layout.prefill, layout.decode):
        assert httpx.get(w.spec.url + "/health", timeout=10).status_code == 200


def test_zz_prefill_worker_killed_mid_transfer_the_request_still_completes(layout):
    body = chat_body(words(7, 1200))
    expected = text_of(post(layout.single.spec.url, "/v1/chat/completions", body))
    before = server_stats(layout.decode)
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(text=streamed_text(layout.url, body)))
    t.start()
    deadline = time.monotonic() + 30
    while kv_cache(layout.prefill)["used_blocks"] == 0:  # the prefill is under way
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(layout.prefill.proc.pid, signal.SIGKILL)
    t.join(120)
    assert not t.is_alive() and result["text"] == expected
    deadline = time.monotonic() + 5
    while server_stats(layout.decode)["fallbacks"] < before["fallbacks"] + 1:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    wait_released(layout.decode)
