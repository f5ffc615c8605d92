"""The same gateway in front of the router: keys, metering from the replicas' usage, and the
client's key never forwarded to a replica."""

from __future__ import annotations

import asyncio
import json

import httpx

from tests.gateway.harness import ADMIN_KEY, write_config
from tests.router.fakes import BAD, GOOD, OK_JSON, SSE, Chunks
from tokenmill.router.app import build_router_app
from tokenmill.router.config import RouterConfig
from tokenmill.router.prompts import PromptHasher
from tokenmill.router.replicas import ReplicaSpec
from tokenmill.router.router import Router

STREAM_USAGE = {"prompt_tokens": 99, "completion_tokens": 2, "total_tokens": 101,
                "prompt_tokens_details": {"cached_tokens": 80}}  # fmt: skip


def test_gateway_in_front_of_the_router(tmp_path):
    seen: list[httpx.Request] = []

    async def transport(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        if request.url.path == "/server_info":
            return httpx.Response(200, content=b'{"engine": {"block_size": 16, "pid": 1}}')
        seen.append(request)
        body = json.loads(request.content)
        if not body.get("stream"):
            return httpx.Response(200, json=OK_JSON)
        chunks = [
            {"choices": [{"index": 0, "text": "a", "finish_reason": None}], "usage": {**STREAM_USAGE, "completion_tokens": 1}},
            {"choices": [{"index": 0, "text": "b", "finish_reason": "stop"}], "usage": STREAM_USAGE},
            {"choices": [], "usage": STREAM_USAGE},
        ]  # fmt: skip
        data = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]
        return httpx.Response(200, stream=Chunks(data), headers=SSE)

    async def main():
        router = Router(
            RouterConfig(health_interval_s=60), [ReplicaSpec.parse(GOOD), ReplicaSpec.parse(BAD)]
        )
        app = build_router_app(router, PromptHasher(None, None), httpx.MockTransport(transport),
                               api_key="replica-key", gateway_config=str(write_config(tmp_path)))  # fmt: skip
        gateway = app.state.gateway
        async with app.router.lifespan_context(app):
            for _ in range(100):
                if len(router.healthy()) == 2:
                    break
                await asyncio.sleep(0.01)
            http = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://router")
            reply = await http.post(
                "/admin/keys", json={"name": "r"}, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
            )
            key, key_id = reply.json()["key"], reply.json()["id"]
            body = {"model": "m", "prompt": list(range(1, 100)), "max_tokens": 4}
            assert (await http.post("/v1/completions", json=body)).status_code == 401
            assert (
                await http.post(
                    "/v1/completions", json=body, headers={"Authorization": "Bearer replica-key"}
                )
            ).status_code == 401
            auth = {"Authorization": f"Bearer {key}"}
            reply = await http.post("/v1/completions", json=body, headers=auth)
            assert reply.status_code == 200 and reply.json()["usage"] == OK_JSON["usage"]
            reply = await http.post("/v1/completions", json={**body, "stream": True}, headers=auth)
            assert reply.status_code == 200 and "usage" not in reply.text  # the client did not ask
            assert "".join(json.loads(x[6:])["choices"][0]["text"] for x in reply.text.splitlines()
                           if x.startswith("data: {")) == "ab"  # fmt: skip
            await http.aclose()
        for request in seen:  # the replica sees the router's key, never the client's
            assert request.headers.get("authorization") == "Bearer replica-key"
        streamed = json.loads(seen[-1].content)
        assert streamed["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
        gateway.ledger.flush(10)
        rows = gateway.db.fetchall(
            "SELECT key_id, prompt_tokens, cached_tokens, completion_tokens FROM usage ORDER BY created"
        )
        assert rows == [(key_id, 99, 96, 4), (key_id, 99, 80, 2)]
        gateway.ledger.close()

    asyncio.run(main())
