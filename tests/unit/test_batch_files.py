"""Batch files without a server: line validation (every malformed kind names its line),
the result store (one result per line, in input order, counts), and the in-flight limiter
that yields to interactive requests."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from tokenmill.server.batch.config import BatchConfig
from tokenmill.server.batch.limiter import InFlightLimiter
from tokenmill.server.batch.lines import read_lines, result_line, validate_file
from tokenmill.server.batch.store import BatchStore
from tokenmill.server.database import Database
from tokenmill.server.errors import APIError

CHAT = "/v1/chat/completions"


def line(cid: str, url: str = CHAT, **over) -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": {}, **over})


@pytest.mark.parametrize(
    ("text", "number", "says"),
    [
        ('{"custom_id": ', 1, "not valid JSON"),
        (
            line("a") + "\n" + json.dumps({"method": "POST", "url": CHAT, "body": {}}),
            2,
            "custom_id",
        ),
        (line("a") + "\n" + line("b") + "\n" + line("a"), 3, "used twice"),
        (line("a", "/v1/embeddings"), 1, "url"),
        (line("a", method="GET"), 1, "method"),
        (line("a", body="text"), 1, "body"),
        (line("a", custom_id=""), 1, "custom_id"),
        (line("a", custom_id="x" * 513), 1, "custom_id"),
        ("\n\n" + line("a", body={"p": "x" * 700}), 3, "longer than"),
        ('{"custom_id": "a", "body": {"t": Infinity}}', 1, "not valid JSON"),
        (line("a") + "\n" + line("b") + "\n" + line("c"), 3, "more than 2"),
    ],
)
def test_malformed_lines_name_their_line(tmp_path, text, number, says):
    path = tmp_path / "in.jsonl"
    path.write_text(text)
    with pytest.raises(APIError) as e:
        validate_file(path, max_line_bytes=600, max_lines=2)
    assert e.value.status == 400 and e.value.param == "file"
    assert e.value.message.startswith(f"line {number}: ") and says in e.value.message


def test_blank_lines_are_skipped_and_numbers_kept(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("\n" + line("a") + "\r\n\n" + line("b", "/v1/completions") + "\n\n")
    summary = validate_file(path, 1000, 10)
    assert summary.lines == 2 and summary.urls == (CHAT, "/v1/completions")
    assert [(x.line, x.custom_id) for x in read_lines(path, 1000)] == [(2, "a"), (4, "b")]
    path.write_text("\n \n")
    with pytest.raises(APIError, match="no requests"):
        validate_file(path, 1000, 10)


def test_result_lines_follow_openai():
    ok = result_line("a", 200, "rid", {"object": "chat.completion"})
    assert ok["id"].startswith("batch_req_") and ok["error"] is None
    assert ok["response"] == {
        "status_code": 200,
        "request_id": "rid",
        "body": {"object": "chat.completion"},
    }
    env = {"error": {"message": "m", "type": "invalid_request_error", "param": "p", "code": None}}
    bad = result_line("b", 400, "rid", env)
    assert bad["response"]["body"] == env
    assert bad["error"] == {"code": "invalid_request_error", "message": "m"}


def test_store_keeps_one_result_per_line_in_input_order():
    store = BatchStore(Database(":memory:"))
    batch = {"id": "batch_1", "created_at": 1, "status": "in_progress", "input_file_id": "f",
             "request_counts": {"total": 3, "completed": 0, "failed": 0}}  # fmt: skip
    assert store.create("me", batch, max_active=1)
    assert not store.create("me", {**batch, "id": "batch_2"}, max_active=1)  # cap
    store.record("batch_1", 3, True, "third")
    store.record("batch_1", 1, False, "first")
    store.record("batch_1", 3, True, "third again")  # a line is recorded once
    assert store.done_lines("batch_1") == {1, 3}
    assert list(store.results("batch_1", True)) == ["third"]
    assert list(store.results("batch_1", False)) == ["first"]
    counts = store.get("batch_1", "me")["request_counts"]
    assert counts == {"total": 3, "completed": 1, "failed": 1}
    assert store.get("batch_1", "someone else") is None
    assert store.uses_file("f") == "batch_1"
    assert store.update("batch_1", {"status": "x"}, only_from=("validating",)) is None


def test_limiter_yields_to_interactive_requests():
    engine = SimpleNamespace(num_in_flight=0)
    limiter = InFlightLimiter(engine, BatchConfig(path="off", max_in_flight=3, busy_in_flight=1))

    async def main() -> None:
        stop = asyncio.Event()
        for _ in range(3):
            assert await limiter.acquire(1, stop)
        engine.num_in_flight = 3  # its own three
        assert limiter.limit() == 3
        engine.num_in_flight = 4  # and one interactive request
        assert limiter.limit() == 1
        waiter = asyncio.create_task(limiter.acquire(1, stop))
        await asyncio.sleep(0.1)
        assert not waiter.done()
        stop.set()
        assert await waiter is False  # stopped, no slot taken
        for _ in range(3):
            limiter.release(1)
        assert limiter.lines == 0 and limiter.seqs == 0

    asyncio.run(main())
