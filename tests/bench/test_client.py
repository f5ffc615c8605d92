"""SSE parsing into token arrivals, error capture, request bodies (mock transport)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tokenmill.bench.client import Prepared, request_body, send
from tokenmill.bench.config import Target


def sse(*events) -> list[bytes]:
    return [
        (f"data: {e}\n\n" if isinstance(e, str) else f"data: {json.dumps(e)}\n\n").encode()
        for e in events
    ]


def run(chunks: list[bytes], target: Target, status: int = 200, delay: float = 0.0):
    async def stream():
        for c in chunks:
            await asyncio.sleep(delay)
            yield c

    async def handler(request: httpx.Request) -> httpx.Response:
        run.body = json.loads(request.content)
        if status != 200:
            return httpx.Response(status, content=b"".join(chunks))
        return httpx.Response(200, content=stream())

    async def main():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            req = Prepared(
                0, 0, 0.0, 3, 5, messages=({"role": "user", "content": "x"},), prompt="x"
            )
            return await send(client, target, "m", req, 0.0)

    return asyncio.run(main())


CHAT = Target("t", "http://server", endpoint="chat")
COMPLETIONS = Target("t", "http://server", endpoint="completions")


def chat_chunk(content, completion_tokens=None, finish=None):
    body = {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]}
    if completion_tokens is not None:
        body["usage"] = {"prompt_tokens": 7, "completion_tokens": completion_tokens}
    return body


def test_continuous_usage_gives_tokens_per_chunk():
    usage = {
        "prompt_tokens": 7,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 2},
    }
    rec = run(
        sse(
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
            chat_chunk("Hel", 1),
            chat_chunk("lo wor", 3),  # two tokens in one chunk
            chat_chunk("", 3, finish="length"),
            {"choices": [], "usage": usage},
            "[DONE]",
        ),
        CHAT,
    )
    assert rec.success and rec.error is None
    assert rec.chunk_tokens == (1, 2)
    assert (rec.prompt_tokens, rec.output_tokens, rec.cached_tokens) == (7, 3, 2)
    assert rec.text == "Hello wor"
    assert rec.start_s <= rec.chunk_times[0] <= rec.chunk_times[1] <= rec.end_s


def test_usage_only_at_the_end_counts_one_token_per_text_chunk():
    """llama-server style completions: usage arrives with the last chunk only."""
    final = {
        "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 3},
    }
    rec = run(
        sse(*({"choices": [{"index": 0, "text": t}]} for t in "abc"), final, "[DONE]"),
        COMPLETIONS,
        delay=0.01,
    )
    assert rec.success and rec.chunk_tokens == (1, 1, 1) and rec.num_output_tokens == 3
    assert rec.ttft_s is not None and rec.ttft_s > 0


def test_error_event_mid_stream_fails_the_request():
    rec = run(sse(chat_chunk("a", 1), {"error": {"message": "engine died"}}, "[DONE]"), CHAT)
    assert not rec.success and rec.error == "engine died"


def test_http_error_envelope():
    body = json.dumps({"error": {"message": "too long", "type": "invalid_request_error"}})
    rec = run([body.encode()], CHAT, status=400)
    assert not rec.success and rec.status == 400 and rec.error == "HTTP 400: too long"


def test_no_tokens_is_a_failure():
    rec = run(sse("[DONE]"), CHAT)
    assert not rec.success and rec.error == "no output tokens streamed"


def test_timeout_is_counted():
    target = Target("t", "http://server", endpoint="chat", request_timeout_s=0.1)
    rec = run(sse(chat_chunk("a", 1), chat_chunk("b", 2), "[DONE]"), target, delay=0.3)
    assert not rec.success and rec.error.startswith("timeout")
    assert rec.latency_s == pytest.approx(0.1, abs=0.08)


def test_request_bodies():
    req = Prepared(0, 0, 0.0, 16, 5, messages=({"role": "user", "content": "x"},), prompt="x")
    chat = request_body(CHAT, "m", req)
    assert chat["messages"] == [{"role": "user", "content": "x"}] and "prompt" not in chat
    assert chat["ignore_eos"] is True and chat["min_tokens"] == 16 and chat["max_tokens"] == 16
    assert chat["stream"] and chat["stream_options"]["include_usage"]
    plain = request_body(Target("t", "http://s", ignore_eos=False), None, req)
    assert plain["prompt"] == "x" and "ignore_eos" not in plain and "model" not in plain
    assert CHAT.url == "http://server/v1/chat/completions"
