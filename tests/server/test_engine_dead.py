"""A dead engine core admits no work: everything that would queue some (chat, completions,
responses, background responses, batches) answers 503 engine_dead at once. Work admitted
while it was alive ends saying why: a background response fails with code engine_dead (it
used to say rate_limit_exceeded, so clients retried a dead server), and a running batch ends
failed with its unanswered lines as engine_dead error lines (it used to stay in_progress)."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx

from tests.server.conftest import MODEL, start_server
from tests.server.test_lifecycle import metric, wait_for

LONG = {"max_tokens": 400, "ignore_eos": True, "temperature": 0}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Tell a story."}]}
http = httpx.Client(timeout=30)


def create_batch(srv, lines: int, body: dict) -> httpx.Response:
    rows = [
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        for i in range(lines)
    ]
    data = "\n".join(json.dumps(r) for r in rows).encode()
    up = http.post(f"{srv.v1}/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"})
    assert up.status_code == 200, up.text
    create = {"input_file_id": up.json()["id"], "endpoint": "/v1/chat/completions",
              "completion_window": "24h"}  # fmt: skip
    return http.post(f"{srv.v1}/batches", json=create)


def until(srv, path: str, done, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        obj = http.get(f"{srv.v1}{path}").json()
        if done(obj) or time.monotonic() > deadline:
            return obj
        time.sleep(0.2)


def assert_engine_dead(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "engine_dead", r.text


def test_a_dead_engine_admits_nothing_and_running_work_ends(tmp_path):
    srv = start_server(tmp_path, "--max-num-seqs", "4", "--batch-max-in-flight", "2")
    try:
        background = http.post(
            f"{srv.v1}/responses",
            json={"model": MODEL, "input": "Tell a story.", "background": True,
                  "max_output_tokens": 400, "ignore_eos": True},
        )  # fmt: skip
        assert background.status_code == 200, background.text
        batch = create_batch(srv, 6, {**CHAT, **LONG})
        assert batch.status_code == 200, batch.text
        batch = batch.json()
        assert wait_for(lambda: metric(srv, "tokenmill:num_requests_running") >= 3, 60)
        os.kill(http.get(f"{srv.base_url}/server_info").json()["engine"]["pid"], signal.SIGKILL)
        assert wait_for(lambda: http.get(f"{srv.base_url}/health").status_code == 503, 10)

        # work admitted while alive ends, saying why
        rid = background.json()["id"]
        resp = until(srv, f"/responses/{rid}", lambda o: o["status"] == "failed")
        assert resp["status"] == "failed" and resp["error"]["code"] == "engine_dead", resp
        done = until(srv, f"/batches/{batch['id']}", lambda o: o["status"] == "failed")
        assert done["status"] == "failed", done
        assert done["errors"]["data"][0]["code"] == "engine_dead", done
        counts = done["request_counts"]
        assert counts["total"] == 6 and counts["completed"] + counts["failed"] == 6, counts
        errors = http.get(f"{srv.v1}/files/{done['error_file_id']}/content").text.splitlines()
        assert {json.loads(x)["error"]["code"] for x in errors} == {"engine_dead"}

        # new work is refused at once
        t0 = time.monotonic()
        responses = {"model": MODEL, "input": "hi", "max_output_tokens": 2}
        for path, body in (
            ("/responses", {**responses, "background": True}),
            ("/responses", responses),
            ("/responses", {**responses, "stream": True}),
            ("/chat/completions", {**CHAT, "max_tokens": 2}),
            ("/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2}),
        ):
            assert_engine_dead(http.post(f"{srv.v1}{path}", json=body))
        assert_engine_dead(create_batch(srv, 1, CHAT))
        assert time.monotonic() - t0 < 10
    finally:
        srv.stop()
