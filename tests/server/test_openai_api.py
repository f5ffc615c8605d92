"""The server through the official `openai` client, validated with the client's own types."""

from __future__ import annotations

import concurrent.futures as cf
import re
import uuid

import httpx
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.server.conftest import MODEL

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def post(server, path: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=120, **kw)


def test_models_health_version(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    assert "version" in httpx.get(f"{server.base_url}/version").json()


def test_chat_completion_parses_strictly(server, client):
    r = post(
        server,
        "/v1/chat/completions",
        # A fresh salt: earlier tests on this shared server may have cached the prompt.
        {
            "model": MODEL,
            "messages": MESSAGES,
            "temperature": 0,
            "max_tokens": 32,
            "cache_salt": uuid.uuid4().hex,
        },
    )
    assert r.status_code == 200 and r.headers["x-request-id"]
    parsed = ChatCompletion.model_validate(r.json(), strict=True)
    assert "Paris" in parsed.choices[0].message.content
    assert parsed.choices[0].finish_reason in ("stop", "length")
    usage = parsed.usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens == 0
    via_client = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=0, max_tokens=32
    )
    assert via_client.choices[0].message.content == parsed.choices[0].message.content


def test_chat_streaming_with_usage(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        temperature=0,
        max_tokens=32,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    for c in chunks:
        ChatCompletionChunk.model_validate(c.model_dump(), strict=True)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    final = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=0, max_tokens=32
    )
    assert text == final.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert (
        chunks[-1].choices == []
        and chunks[-1].usage.completion_tokens == final.usage.completion_tokens
    )
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")


def test_raw_stream_ends_with_done(server):
    with httpx.stream(
        "POST",
        f"{server.v1}/chat/completions",
        json={"model": MODEL, "messages": MESSAGES, "max_tokens": 5, "stream": True},
        timeout=60,
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)


def test_n2_stop_seed_and_logprobs(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        n=2,
        temperature=1.0,
        seed=42,
        max_tokens=16,
        logprobs=True,
        top_logprobs=3,
    )
    assert [c.index for c in r.choices] == [0, 1]
    again = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        n=2,
        temperature=1.0,
        seed=42,
        max_tokens=16,
        logprobs=True,
        top_logprobs=3,
    )
    assert [c.message.content for c in r.choices] == [c.message.content for c in again.choices]
    for choice in r.choices:
        content = choice.logprobs.content
        assert content and all(len(t.top_logprobs) == 3 for t in content)
        assert all(t.logprob <= 0 and t.bytes is not None for t in content)
    stopped = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=0, max_tokens=32, stop=["Paris"]
    )
    assert (
        "Paris" not in stopped.choices[0].message.content
        and stopped.choices[0].finish_reason == "stop"
    )


def test_completions_variants(server, client):
    c = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    Completion.model_validate(c.model_dump(), strict=True)
    assert c.choices[0].text and c.usage.prompt_tokens == 5
    many = client.completions.create(
        model=MODEL, prompt=["One, two,", "Red, green,"], max_tokens=4, temperature=0
    )
    assert sorted(ch.index for ch in many.choices) == [0, 1]
    token_ids = post(server, "/tokenize", {"prompt": "The capital of France is"}).json()["tokens"]
    ids = client.completions.create(model=MODEL, prompt=token_ids, max_tokens=8, temperature=0)
    assert ids.choices[0].text == c.choices[0].text
    echo = client.completions.create(
        model=MODEL,
        prompt="The capital of France is",
        max_tokens=4,
        temperature=0,
        echo=True,
        logprobs=2,
    )
    lp = echo.choices[0].logprobs
    assert echo.choices[0].text.startswith("The capital of France is")
    assert lp.token_logprobs[0] is None and len(lp.tokens) == 5 + 4
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": "hi", "suffix": "bye"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
    stream = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True
    )
    assert "".join(ch.choices[0].text for ch in stream if ch.choices) == c.choices[0].text


def test_max_completion_tokens_and_context_errors(server, client):
    r = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_completion_tokens=3, temperature=0
    )
    assert r.usage.completion_tokens <= 3
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi " * 5000}],
        "max_tokens": 5000,
    }
    err = post(server, "/v1/chat/completions", body).json()["error"]
    assert (
        err["code"] == "context_length_exceeded"
        and "8192" in err["message"]
        and "5000" in err["message"]
    )


def test_tokenize_detokenize(server):
    r = post(server, "/tokenize", {"model": MODEL, "prompt": "Hello world"}).json()
    assert r["tokens"] == [19556, 905] and r["count"] == 2
    assert (
        post(server, "/detokenize", {"model": MODEL, "tokens": r["tokens"]}).json()["prompt"]
        == "Hello world"
    )
    chat = post(server, "/tokenize", {"model": MODEL, "messages": MESSAGES}).json()
    assert chat["count"] > 10


TOOL = {"type": "function", "function": {"name": "now", "description": "The current time",
        "parameters": {"type": "object", "properties": {}}}}  # fmt: skip


@pytest.mark.parametrize(
    "extra",
    [
        {"tools": [TOOL]},
        {
            "messages": [*MESSAGES, {"role": "assistant", "content": "Well,"}],
            "continue_final_message": True,
            "add_generation_prompt": False,
        },  # fmt: skip
        {"chat_template_kwargs": {"custom_flag": True}, "tools": [TOOL]},
    ],
    ids=["tools", "continue-final-message", "template-kwargs"],
)
def test_tokenize_counts_what_chat_would_send(server, extra):
    """/tokenize renders messages as chat does (tools, a continued assistant turn): its count
    is the prompt_tokens of the same chat request."""
    body = {"model": MODEL, "messages": MESSAGES, **extra}
    counted = post(server, "/tokenize", body).json()
    chat = post(server, "/v1/chat/completions", {**body, "max_tokens": 1}).json()
    assert counted["count"] == chat["usage"]["prompt_tokens"] == len(counted["tokens"])
    plain = post(server, "/tokenize", {"model": MODEL, "messages": body["messages"]}).json()
    assert plain["count"] != counted["count"]


def test_32_concurrent_streams_match_offline_greedy(server, client):
    from tokenmill import LLM, SamplingParams

    prompts = [f"Write one sentence about the number {i}." for i in range(32)]

    def stream_text(prompt: str) -> str:
        s = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            temperature=0,
            max_tokens=24,
            stream=True,
        )
        return "".join(c.choices[0].delta.content or "" for c in s if c.choices)

    with cf.ThreadPoolExecutor(32) as pool:
        served = list(pool.map(stream_text, prompts))
    llm = LLM(kv_cache_memory_gib=0.25)
    offline = llm.chat(
        [[{"role": "user", "content": p}] for p in prompts],
        SamplingParams(temperature=0, max_tokens=24),
    )
    assert served == [o.outputs[0].text for o in offline]


def test_metrics_exposed(server):
    text = httpx.get(f"{server.base_url}/metrics").text
    for name in (
        "tokenmill:num_requests_running",
        "tokenmill:num_requests_waiting",
        "tokenmill:kv_cache_usage_perc",
        "tokenmill:prefix_cache_queries_total",
        "tokenmill:prefix_cache_hits_total",
        "tokenmill:prompt_tokens_total",
        "tokenmill:generation_tokens_total",
        "tokenmill:request_success_total",
        "tokenmill:time_to_first_token_seconds_bucket",
        "tokenmill:inter_token_latency_seconds_bucket",
        "tokenmill:e2e_request_latency_seconds_bucket",
        "tokenmill:request_queue_time_seconds_bucket",
        "tokenmill:repetition_cutoffs_total",
    ):
        assert name in text, name


def test_request_id_echoed(server):
    r = post(server, "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 2},
             headers={"X-Request-Id": "my-trace-123"})  # fmt: skip
    assert r.headers["x-request-id"] == "my-trace-123"


def test_prefix_cache_cached_tokens_and_reset(server, client):
    system = "You are a meticulous assistant. " + " ".join(
        f"Rule {i}: answer precisely." for i in range(40)
    )
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Say yes."}]
    first = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=2, temperature=0
    )
    second = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=2, temperature=0
    )
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens - 16 and cached % 16 == 0
    assert second.choices[0].message.content == first.choices[0].message.content
    salted = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=2,
        temperature=0,
        extra_body={"cache_salt": "tenant-b"},
    )
    assert salted.usage.prompt_tokens_details.cached_tokens == 0
    text = httpx.get(f"{server.base_url}/metrics").text
    hits = float(
        re.search(r"^tokenmill:prefix_cache_hits_total\{[^}]*\} (\S+)$", text, re.M).group(1)
    )
    assert hits >= cached
    r = httpx.post(f"{server.base_url}/reset_prefix_cache", timeout=30)
    assert r.status_code == 200 and r.json() == {"reset": True}
    third = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=2, temperature=0
    )
    assert third.usage.prompt_tokens_details.cached_tokens == 0
