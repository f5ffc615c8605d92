"""Hostile requests through the gateway: every one gets a 4xx in the OpenAI envelope (never a
500 or a hang), is metered, and the next good request is served. BAD_BODIES run against the
real server (test_gateway_server.py); headers and the admin API here."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.gateway.harness import ADMIN_KEY, make_harness

RULES = {
    "guardrails": {"rules": [{"name": "pii", "scanner": "pii", "action": "redact"}]},
    "tool_policies": {"p": {"allow": ["f"]}},
}
CHAT = "/v1/chat/completions"
BAD_BODIES = [
    (CHAT, b"{not json"),
    (CHAT, b"[]"),
    (CHAT, b'"string"'),
    (CHAT, b"[" * 100000 + b"]" * 100000),
    (CHAT, json.dumps({"model": "m", "messages": "hello"}).encode()),
    (CHAT, json.dumps({"model": "m", "messages": [1, None, "x", {"content": {"a": 1}}]}).encode()),
    (CHAT, json.dumps({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": 5}, 7]}]}).encode()),
    (CHAT, json.dumps({"model": ["m"], "messages": []}).encode()),
    (CHAT, json.dumps({"model": "m", "messages": [], "stream": "yes", "stream_options": 5}).encode()),
    (CHAT, json.dumps({"model": "m", "messages": [], "stream": True, "stream_options": [1]}).encode()),
    (CHAT, json.dumps({"model": "m", "messages": [], "tools": "x", "n": "two"}).encode()),
    (CHAT, json.dumps({"model": "m", "messages": [], "tools": [{"function": 5}, 3, {"function": {"name": 1}}]}).encode()),
    (CHAT, json.dumps({"model": "m", "messages": [], "max_tokens": 10**30}).encode()),
    (CHAT, json.dumps({"model": "m", "messages": [], "max_tokens": -5, "n": 10**9}).encode()),
    (CHAT, json.dumps({"model": "m", "messages": [{"role": "user", "content": "\ud800 \x00 \u202e"}]}).encode()),
    ("/v1/completions", json.dumps({"model": "m", "prompt": [[1, 2], "x"]}).encode()),
    ("/v1/completions", json.dumps({"model": "m", "prompt": [1, 2, 3]}).encode()),
    ("/v1/responses", json.dumps({"model": "m", "input": 5, "instructions": ["x"]}).encode()),
    ("/v1/responses", json.dumps({"model": "m", "input": [{"content": [{"text": None}]}, 4]}).encode()),
    ("/v1/responses", json.dumps({"model": "m", "input": "x", "background": True}).encode()),
]  # fmt: skip


@pytest.fixture
def harness(tmp_path):
    h = make_harness(tmp_path, RULES)
    yield h
    h.close()


def test_hostile_headers_and_admin_inputs(harness):
    async def main():
        for header in (
            b"Bearer " + b"\xff" * 300,
            b"Bearer " + b"a" * 100000,
            b"Basic abc",
            b"bearer",
        ):
            async with harness.client(None) as c:
                reply = await c.get("/v1/models", headers={b"Authorization": header})
                assert reply.status_code == 401
        async with harness.client(ADMIN_KEY) as admin:
            assert (await admin.get("/admin/keys/" + "k" * 10000)).status_code == 404
            for body in (b"{", b"[]", b"null", json.dumps({"models": ["x"] * 5000}).encode(),
                         json.dumps({"metadata": {"k": "v" * 5000}}).encode(),
                         json.dumps({"budget_usd": float("1e300")}).encode()):  # fmt: skip
                reply = await admin.post("/admin/keys", content=body)
                assert reply.status_code == 400, (body[:60], reply.text)
            reply = await admin.get("/admin/usage", params={"group_by": "nonsense"})
            assert reply.status_code == 400
            reply = await admin.get("/admin/usage", params={"since": "-1e400"})
            assert reply.status_code == 400

    asyncio.run(main())
