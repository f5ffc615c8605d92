"""The Batch API end to end: the official `openai` client uploads a JSONL file, creates a
batch, polls it and reads the output; every object parses strictly into the client's models
and every line's body into ChatCompletion / Completion, equal to the same request sent
interactively (temperature 0) and to `tokenmill batch` offline. Malformed files and unknown
or someone else's ids get the OpenAI envelope; cancel aborts lines and frees their KV; a
batch survives a restart with every line answered exactly once."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI
from openai.types import Batch, Completion, FileObject
from openai.types.chat import ChatCompletion

from tests.server.conftest import MODEL, ServerProcess, start_server
from tests.server.test_responses import extra_fields
from tokenmill.server.batch.store import BatchStore
from tokenmill.server.database import Database

CHAT = "/v1/chat/completions"
PROMPTS = ["Say hi", "Name a color", "Count to three", "What is 2+2?", "Name a fruit"]
MAX_FILE_MIB = 1
MAX_BODY = 65536
http = httpx.Client(timeout=120)  # this machine may be busy


def line(custom_id: str, body: dict[str, Any], url: str = CHAT) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def chat_body(prompt: str, max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return ("\n".join(json.dumps(x) for x in lines) + "\n").encode()


def strict(model: Any, raw: dict[str, Any]) -> Any:
    obj = model.model_validate(raw)
    assert extra_fields(obj) == [], extra_fields(obj)
    return obj


def body_of(model: Any, raw: dict[str, Any]) -> Any:
    """A completion body: the client's model, with vLLM's `stop_reason` the only extra."""
    obj = model.model_validate(raw)
    assert all(f.endswith("].stop_reason") for f in extra_fields(obj)), extra_fields(obj)
    return obj


def upload(server: ServerProcess, lines: list[dict[str, Any]]) -> FileObject:
    r = http.post(
        f"{server.v1}/files",
        files={"file": ("in.jsonl", jsonl(lines))},
        data={"purpose": "batch"},
    )
    assert r.status_code == 200, r.text
    return strict(FileObject, r.json())


def wait(server: ServerProcess, batch_id: str, until: tuple[str, ...], timeout=300) -> Batch:
    deadline = time.monotonic() + timeout
    while True:
        r = http.get(f"{server.v1}/batches/{batch_id}")
        assert r.status_code == 200, r.text
        batch = strict(Batch, r.json())
        if batch.status in until or time.monotonic() > deadline:
            assert batch.status in until, batch
            return batch
        time.sleep(0.3)


def contents(client: OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


def close(a: Any, b: Any, path: str = "") -> None:
    """Equal, floats (logprobs) within 1e-3: a batch of other sizes rounds differently."""
    if isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, abs=1e-3), path
    elif isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            close(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def same_answer(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Two completion bodies agree on everything but their ids, times and prefix-cache hits
    (the same tokens: the requests run at temperature 0)."""
    for body in (a, b):
        body["usage"]["prompt_tokens_details"].pop("cached_tokens")
        for choice in body["choices"]:
            for call in (choice.get("message") or {}).get("tool_calls") or []:
                call.pop("id")
    drop = ("id", "created")
    close(
        {k: v for k, v in a.items() if k not in drop}, {k: v for k, v in b.items() if k not in drop}
    )


@pytest.fixture(scope="module")
def bserver(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("batches")
    srv = start_server(
        tmp, "--max-num-seqs", "16", "--max-file-mib", str(MAX_FILE_MIB),
        "--max-request-body", str(MAX_BODY),
    )  # fmt: skip
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


@pytest.fixture(scope="module")
def bclient(bserver):
    return OpenAI(base_url=bserver.v1, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def chat_batch(bserver, bclient, tmp_path_factory):
    """A served chat batch: 5 good lines, 1 with a bad parameter. (input path, batch)."""
    lines = [line(f"req-{i}", chat_body(p)) for i, p in enumerate(PROMPTS)]
    lines.append(line("bad-temperature", chat_body("Hi", temperature=5)))
    path = tmp_path_factory.mktemp("chat") / "in.jsonl"
    path.write_bytes(jsonl(lines))
    file = bclient.files.create(file=path.open("rb"), purpose="batch")
    assert file.purpose == "batch" and file.bytes == path.stat().st_size
    batch = bclient.batches.create(
        input_file_id=file.id, endpoint=CHAT, completion_window="24h", metadata={"run": "t"}
    )
    assert batch.status == "validating" and batch.request_counts.total == 6
    return path, wait(bserver, batch.id, ("completed",))


# ---------------------------------------------------------------- results


def test_chat_batch_parses_strictly_and_matches_interactive(bserver, bclient, chat_batch):
    _, batch = chat_batch
    assert batch.request_counts.model_dump() == {"completed": 5, "failed": 1, "total": 6}
    assert batch.metadata == {"run": "t"}
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
    assert batch.created_at <= batch.in_progress_at <= batch.completed_at
    out = contents(bclient, batch.output_file_id)
    assert sorted(x["custom_id"] for x in out) == [f"req-{i}" for i in range(5)]
    for x in out:
        assert x["id"].startswith("batch_req_") and x["error"] is None
        assert x["response"]["status_code"] == 200 and x["response"]["request_id"]
        body_of(ChatCompletion, x["response"]["body"])
        prompt = PROMPTS[int(x["custom_id"].split("-")[1])]
        interactive = http.post(f"{bserver.v1}/chat/completions", json=chat_body(prompt))
        same_answer(x["response"]["body"], interactive.json())
    (err,) = contents(bclient, batch.error_file_id)
    assert err["custom_id"] == "bad-temperature"
    assert err["response"]["status_code"] == 400
    assert err["response"]["body"]["error"]["param"] == "temperature"
    assert err["error"]["code"] == "invalid_request_error"
    meta = strict(FileObject, http.get(f"{bserver.v1}/files/{batch.output_file_id}").json())
    assert meta.purpose == "batch_output"


def test_completions_batch(bserver, bclient):
    bodies = [
        {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0},
        {"model": MODEL, "prompt": ["The sky is", "Water is"], "max_tokens": 4, "temperature": 0},
        {"model": MODEL, "prompt": "Hi", "max_tokens": 4, "temperature": 0, "logprobs": 2},
    ]
    file = upload(bserver, [line(f"c{i}", b, "/v1/completions") for i, b in enumerate(bodies)])
    wrong = http.post(
        f"{bserver.v1}/batches",
        json={"input_file_id": file.id, "endpoint": CHAT, "completion_window": "24h"},
    )
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "input_file_id"
    batch = bclient.batches.create(
        input_file_id=file.id, endpoint="/v1/completions", completion_window="24h"
    )
    batch = wait(bserver, batch.id, ("completed",))
    assert batch.error_file_id is None
    out = {x["custom_id"]: x for x in contents(bclient, batch.output_file_id)}
    for i, body in enumerate(bodies):
        got = out[f"c{i}"]["response"]["body"]
        body_of(Completion, got)
        same_answer(got, http.post(f"{bserver.v1}/completions", json=body).json())


def test_listing_and_deleting(bserver, bclient, chat_batch):
    _, batch = chat_batch
    ids = [f.id for f in bclient.files.list()]
    assert batch.input_file_id in ids and batch.output_file_id in ids
    only = bclient.files.list(purpose="batch_output")
    assert all(f.purpose == "batch_output" for f in only)
    raw = http.get(f"{bserver.v1}/batches", params={"limit": 1}).json()
    assert raw["object"] == "list" and len(raw["data"]) == 1 and raw["has_more"] is True
    strict(Batch, raw["data"][0])
    seen = [b.id for b in bclient.batches.list(limit=1)]  # the client follows `after`
    assert batch.id in seen and len(seen) == len(set(seen))
    extra = upload(bserver, [line("x", chat_body("Hi"))])
    deleted = bclient.files.delete(extra.id)
    assert deleted.deleted and deleted.id == extra.id
    for method, path in [
        ("GET", f"/files/{extra.id}"),
        ("GET", f"/files/{extra.id}/content"),
        ("DELETE", f"/files/{extra.id}"),
    ]:
        r = http.request(method, f"{bserver.v1}{path}")
        assert r.status_code == 404 and r.json()["error"]["param"] == "file_id", r.text


# ---------------------------------------------------------------- hostile input

LONG = "x" * (MAX_BODY + 10)
MALFORMED = {
    "bad json": (b'{"custom_id": "a", ', 1),
    "missing custom_id": (jsonl([{"method": "POST", "url": CHAT, "body": {}}]), 1),
    "duplicate custom_id": (jsonl([line("a", {}), line("b", {}), line("a", {})]), 3),
    "wrong url": (jsonl([line("a", {}), line("b", {}, "/v1/embeddings")]), 2),
    "wrong method": (jsonl([{**line("a", {}), "method": "GET"}]), 1),
    "non-object body": (jsonl([line("a", {}), {**line("b", {}), "body": [1]}]), 2),
    "non-object line": (b"[1, 2]\n", 1),
    "oversized line": (jsonl([line("a", {}), line("b", {"p": LONG})]), 2),
    "invalid utf-8": (b'{"custom_id": "\xff"}\n', 1),
    "NaN": (b'{"custom_id": "a", "method": "POST", "url": "' + CHAT.encode() + b'", "body": {"t": NaN}}', 1),
}  # fmt: skip


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_lines_are_refused_naming_the_line(bserver, case):
    data, number = MALFORMED[case]
    r = http.post(
        f"{bserver.v1}/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"}
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == "file"
    assert err["message"].startswith(f"line {number}: "), err


def test_bad_uploads(bserver):
    url = f"{bserver.v1}/files"
    good = jsonl([line("a", chat_body("Hi"))])
    cases = [
        ({"files": {"file": ("in.jsonl", b"\n\n")}, "data": {"purpose": "batch"}}, 400, "file"),
        ({"files": {"file": ("in.jsonl", good)}, "data": {"purpose": "fine-tune"}}, 400, "purpose"),
        ({"files": {"file": ("in.jsonl", good)}}, 400, "purpose"),
        ({"files": {"other": ("x", b"1")}, "data": {"purpose": "batch"}}, 400, "file"),
        ({"data": {"purpose": "batch"}}, 415, None),  # not multipart
        ({"json": {"purpose": "batch"}}, 415, None),
    ]
    for kwargs, status, param in cases:
        r = http.post(url, **kwargs)
        assert r.status_code == status, (kwargs, r.text)
        assert r.json()["error"]["param"] == param, r.text
    big = b"x" * (MAX_FILE_MIB * 2**20 + 1)

    def chunks():  # no Content-Length: the cap holds on the bytes received
        boundary = b"--b\r\n"
        yield boundary + b'Content-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        yield boundary + b'Content-Disposition: form-data; name="file"; filename="a"\r\n\r\n'
        for i in range(0, len(big), 65536):
            yield big[i : i + 65536]
        yield b"\r\n--b--\r\n"

    for content in (b"".join(chunks()), chunks()):
        r = http.post(
            url, content=content, headers={"content-type": "multipart/form-data; boundary=b"}
        )
        assert r.status_code == 413, r.text
        assert r.json()["error"]["code"] == "file_too_large"
    leftovers = [
        p for p in (Path(bserver.log_path).parent / "files").iterdir() if p.stat().st_size > 2**20
    ]
    assert leftovers == []
    assert http.get(f"{bserver.base_url}/health").status_code == 200


def test_bad_batch_requests(bserver, bclient, chat_batch):
    _, done = chat_batch
    url = f"{bserver.v1}/batches"
    good = {"input_file_id": done.input_file_id, "endpoint": CHAT, "completion_window": "24h"}
    cases = [
        ({**good, "input_file_id": "file-" + "0" * 24}, 404, "input_file_id"),
        ({**good, "input_file_id": "../../etc/passwd"}, 404, "input_file_id"),
        ({**good, "input_file_id": done.output_file_id}, 400, "input_file_id"),
        ({**good, "endpoint": "/v1/embeddings"}, 400, "endpoint"),
        ({**good, "completion_window": "48h"}, 400, "completion_window"),
        ({**good, "metadata": {f"k{i}": "v" for i in range(17)}}, 400, "metadata"),
        ({"endpoint": CHAT, "completion_window": "24h"}, 400, "input_file_id"),
    ]
    for body, status, param in cases:
        r = http.post(url, json=body)
        assert r.status_code == status, (body, r.text)
        assert r.json()["error"]["param"] == param, r.text
    for method, path in [
        ("GET", "/batches/batch_" + "0" * 24),
        ("POST", "/batches/batch_" + "0" * 24 + "/cancel"),
        ("GET", "/batches/nonsense"),
    ]:
        r = http.request(method, f"{bserver.v1}{path}")
        assert r.status_code == 404 and r.json()["error"]["param"] == "batch_id", r.text
    # a finished batch cancels to itself
    again = strict(Batch, http.post(f"{url}/{done.id}/cancel").json())
    assert again.status == "completed"


# ---------------------------------------------------------------- cancel


def test_cancel_aborts_running_lines_and_frees_their_kv(bserver, bclient):
    body = chat_body("Tell a long story", max_tokens=2000, ignore_eos=True)
    file = upload(bserver, [line(f"long-{i}", body) for i in range(6)])
    batch = bclient.batches.create(input_file_id=file.id, endpoint=CHAT, completion_window="24h")
    wait(bserver, batch.id, ("in_progress",))
    deadline = time.monotonic() + 60
    while http.get(f"{bserver.base_url}/server_info").json()["in_flight"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    r = http.delete(f"{bserver.v1}/files/{file.id}")  # the running batch still reads it
    assert r.status_code == 400 and r.json()["error"]["param"] == "file_id"
    cancelling = bclient.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    done = wait(bserver, batch.id, ("cancelled",), timeout=60)
    assert done.cancelled_at and done.request_counts.completed == 0
    deadline = time.monotonic() + 10
    while True:
        info = http.get(f"{bserver.base_url}/server_info").json()
        kv = http.get(f"{bserver.base_url}/kv_cache").json()
        if info["in_flight"] == 0 and kv["kv_cache_usage"] == 0:
            break
        assert time.monotonic() < deadline, (info, kv)
        time.sleep(0.2)
    assert bclient.files.delete(file.id).deleted  # finished: its input may go now
    # the server kept serving meanwhile
    assert http.post(f"{bserver.v1}/chat/completions", json=chat_body("Hi")).status_code == 200


# ---------------------------------------------------------------- offline


def test_offline_batch_gives_the_served_answers(chat_batch, bclient, tmp_path):
    path, batch = chat_batch
    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "tokenmill.cli", "batch", str(path), str(out), "--no-progress"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    offline = {x["custom_id"]: x for x in map(json.loads, out.read_text().splitlines())}
    served = contents(bclient, batch.output_file_id) + contents(bclient, batch.error_file_id)
    assert sorted(offline) == sorted(x["custom_id"] for x in served)
    for x in served:
        mine = offline[x["custom_id"]]
        assert mine["response"]["status_code"] == x["response"]["status_code"]
        assert (mine["error"] is None) == (x["error"] is None)
        if x["response"]["status_code"] == 200:
            body_of(ChatCompletion, mine["response"]["body"])
            same_answer(mine["response"]["body"], x["response"]["body"])
        else:
            assert mine["response"]["body"] == x["response"]["body"]


def test_offline_batch_refuses_a_malformed_file(tmp_path):
    bad = tmp_path / "in.jsonl"
    bad.write_bytes(jsonl([line("a", {}), line("a", {})]))
    cmd = [sys.executable, "-m", "tokenmill.cli", "batch", str(bad), str(tmp_path / "o.jsonl")]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "line 2: custom_id" in run.stderr, run.stderr


def test_offline_batch_refuses_an_output_it_cannot_or_must_not_write(tmp_path):
    """Before the model loads: OUT in a missing folder (it hung once the engine was up) or
    OUT the input itself (it was emptied, the results lost)."""
    good = tmp_path / "in.jsonl"
    good.write_bytes(jsonl([line("a", {})]))
    before = good.read_bytes()
    for out, says in ((tmp_path / "nope" / "o.jsonl", "does not exist"),
                      (good, "is the input file"), (tmp_path, "is a folder")):  # fmt: skip
        cmd = [sys.executable, "-m", "tokenmill.cli", "batch", str(good), str(out)]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and says in run.stderr, run.stderr
        assert "Traceback" not in run.stderr
    assert good.read_bytes() == before


# ---------------------------------------------------------------- restart


def _answered(logs: list[str], batch_id: str) -> Counter:
    """How many times each line of the batch was answered (access-log entries)."""
    count: Counter = Counter()
    for text in logs:
        for entry in text.splitlines():
            if "tokenmill.access" in entry and f'"{batch_id}-' in entry:
                rid = json.loads(entry.split("tokenmill.access: ", 1)[1])["request_id"]
                count[int(rid.rsplit("-", 1)[1])] += 1
    return count


def _restart_midway(tmp_path: Path, lines: int, max_tokens: int) -> None:
    db = str(tmp_path / "server.sqlite3")
    flags = ("--response-store", db, "--max-num-seqs", "32", "--batch-max-in-flight", "24")
    body = [line(f"r{i}", chat_body(f"Tell me about number {i}", max_tokens)) for i in range(lines)]
    first = start_server(tmp_path, *flags)
    logs = []
    try:
        file = upload(first, body)
        batch = http.post(
            f"{first.v1}/batches",
            json={"input_file_id": file.id, "endpoint": CHAT, "completion_window": "24h"},
        ).json()
        deadline = time.monotonic() + 600
        while True:
            counts = strict(Batch, http.get(f"{first.v1}/batches/{batch['id']}").json())
            if counts.request_counts.completed >= lines // 10:
                break
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        assert first.stop() == 0
        logs.append(first.log())
    stopped = BatchStore(Database(db)).get(batch["id"])
    assert stopped["status"] == "in_progress"
    assert stopped["request_counts"]["completed"] < lines  # stopped midway
    # another owner (a server with a key) sees neither the batch nor its file, and the
    # batch runs on under its own owner
    second = start_server(tmp_path, *flags, "--api-key", "other-key")
    try:
        auth = {"Authorization": "Bearer other-key"}
        for path in (f"/batches/{batch['id']}", f"/files/{file.id}", f"/files/{file.id}/content"):
            r = http.get(f"{second.v1}{path}", headers=auth)
            assert r.status_code == 404, r.text
        r = http.post(f"{second.v1}/batches/{batch['id']}/cancel", headers=auth)
        assert r.status_code == 404
        store = BatchStore(Database(db))
        deadline = time.monotonic() + 900
        while (done := store.get(batch["id"]))["status"] != "completed":
            assert time.monotonic() < deadline, done
            time.sleep(0.5)
    finally:
        assert second.stop() == 0
        logs.append(second.log())
    assert done["request_counts"] == {"total": lines, "completed": lines, "failed": 0}
    files_dir = tmp_path / "files"
    out = [json.loads(x) for x in (files_dir / f"{done['output_file_id']}.jsonl").open()]
    assert sorted(x["custom_id"] for x in out) == sorted(f"r{i}" for i in range(lines))
    answered = _answered(logs, batch["id"])
    assert set(answered) == set(range(1, lines + 1))
    assert max(answered.values()) == 1, [n for n, c in answered.items() if c > 1]


def test_a_batch_survives_a_restart_answering_each_line_once(tmp_path):
    _restart_midway(tmp_path, lines=60, max_tokens=2)


@pytest.mark.slow
def test_a_1000_line_batch_survives_a_restart_answering_each_line_once(tmp_path):
    _restart_midway(tmp_path, lines=1000, max_tokens=8)
