"""The router's HTTP layer against fake replicas (httpx MockTransport): retry before the
first token, clean mid-stream errors, pass-through of client errors, the bounded queue."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.router.fakes import BAD, BODY, GOOD, OK_JSON, Chunks, routed, serve, sse_ok
from tokenmill.router.router import Router

pytestmark = pytest.mark.anyio  # anyio's pytest plugin runs the async tests (conftest)


def metric(router: Router, line: str) -> bool:
    return line in router.metrics.render().decode()


async def test_connect_error_retries_on_the_other_replica():
    def handler(name, request):
        if name == BAD:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json=OK_JSON)

    async with routed(handler) as (client, router):
        for _ in range(4):  # whichever replica is tried first
            r = await client.post("/v1/completions", json=BODY)
            assert r.status_code == 200 and r.headers["x-tokenmill-replica"] == GOOD
        assert not router.replicas[BAD].healthy  # taken out at the first refusal
        assert metric(router, 'tokenmill:router_cached_tokens_total{replica="127.0.0.1:9101"}')


async def test_503_before_first_token_retries_once():
    calls = []

    def handler(name, request):
        calls.append(name)
        return httpx.Response(503, json={"error": {"message": "engine_dead"}})

    async with routed(handler) as (client, router):
        r = await client.post("/v1/completions", json={**BODY, "stream": True})
        assert r.status_code == 503 and len(calls) == 2 and set(calls) == {GOOD, BAD}
        assert metric(router, 'tokenmill:router_retries_total{reason="503"} 1.0')


async def test_client_errors_pass_through_without_retry():
    calls = []

    def handler(name, request):
        calls.append(name)
        return httpx.Response(400, json={"error": {"message": "bad", "param": "x"}})

    async with routed(handler) as (client, _):
        r = await client.post(
            "/v1/chat/completions",
            content=b"{not json",
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "x" and len(calls) == 1


async def test_bodies_the_router_cannot_read_reach_a_replica_and_errors_are_enveloped():
    """A body nested past Python's recursion limit or holding a huge integer is forwarded for
    the replica's precise 400 (it was a 500 at the router); unknown paths and methods answer
    in the OpenAI envelope."""
    seen = []

    def handler(name, request):
        seen.append(request.content)
        return httpx.Response(400, json={"error": {"message": "too deep", "param": None}})

    async with routed(handler) as (client, _):
        for body in (b"[" * 100_000 + b"]" * 100_000, b'{"model": ' + b"9" * 5000 + b"}"):
            for path in ("/v1/chat/completions", "/v1/completions"):
                r = await client.post(path, content=body, headers={"content-type": "application/json"})
                assert r.status_code == 400 and r.json()["error"]["message"] == "too deep"
        assert len(seen) == 4
        for method, path, status in (("GET", "/v1/nothing", 404), ("POST", "/v1/responses", 404),
                                     ("GET", "/v1/chat/completions", 405)):  # fmt: skip
            r = await client.request(method, path)
            assert r.status_code == status and r.json()["error"]["type"], r.text


async def test_mid_stream_failure_ends_with_error_event_and_done():
    dead: set[str] = set()

    def handler(name, request):
        dead.add(name)  # the process is gone: its health check will be refused
        fail = httpx.RemoteProtocolError("peer closed connection")
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              stream=Chunks([b'data: {"choices": [{"text": "a"}]}\n\ndata: {"cho'], fail))  # fmt: skip

    async with routed(handler, dead) as (client, router):
        r = await client.post("/v1/completions", json={**BODY, "stream": True})
        assert r.status_code == 200
        events = [e for e in r.text.split("\n\n") if e.strip()]
        assert events[-1] == "data: [DONE]"
        err = json.loads(events[-2].removeprefix("data: "))
        assert err["error"]["code"] == "replica_failed"
        for _ in range(100):  # the failure triggered a health check, which takes it out
            if len(router.healthy()) == 1:
                break
            await asyncio.sleep(0.01)
        assert [r.name for r in router.healthy()] != list(dead)
        assert len(router.healthy()) == 1 and router.loads.total_in_flight() == 0


async def test_stream_closed_without_done_is_an_error():
    def handler(name, request):
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              stream=Chunks([b'data: {"choices": []}\n\n']))  # fmt: skip

    async with routed(handler) as (client, router):
        r = await client.post("/v1/completions", json={**BODY, "stream": True})
        assert "closed the stream before it finished" in r.text and r.text.endswith(
            "data: [DONE]\n\n"
        )
        assert metric(router, "tokenmill:router_stream_errors_total")


async def test_good_stream_passes_through_unchanged():
    def handler(name, request):
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, stream=Chunks(sse_ok())
        )

    async with routed(handler) as (client, router):
        r = await client.post(
            "/v1/completions", json={**BODY, "stream": True}, headers={"x-request-id": "abc"}
        )
        assert r.content == b"".join(sse_ok()) and r.headers["x-request-id"] == "abc"
        assert router.loads.total_in_flight() == 0


async def test_non_streamed_failure_while_generating_retries():
    def handler(name, request):
        if name == BAD:
            return httpx.Response(200, stream=Chunks([b'{"choi'], httpx.ReadError("reset")))
        return httpx.Response(200, json=OK_JSON)

    async with routed(handler) as (client, _):
        for _ in range(3):
            r = await client.post("/v1/completions", json=BODY)
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == "hi"


async def test_all_replicas_down_is_503():
    def handler(name, request):
        raise httpx.ConnectError("refused", request=request)

    async with routed(handler) as (client, router):
        r = await client.post("/v1/completions", json=BODY)
        assert r.status_code == 502 and r.json()["error"]["code"] == "replica_failed"
        r = await client.post("/v1/completions", json=BODY)
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_healthy_replica"
        assert (await client.get("/health")).status_code == 503


async def test_router_queue_is_bounded():
    release = asyncio.Event()

    async def handler(name, request):
        await release.wait()
        return httpx.Response(200, json=OK_JSON)

    async with routed(handler, max_in_flight=1, max_queue=1, queue_timeout_s=5) as (client, router):
        first = asyncio.create_task(client.post("/v1/completions", json=BODY))
        await asyncio.sleep(0.1)
        second = asyncio.create_task(client.post("/v1/completions", json=BODY))  # waits
        await asyncio.sleep(0.1)
        third = await client.post("/v1/completions", json=BODY)
        assert third.status_code == 503 and third.json()["error"]["code"] == "server_busy"
        assert third.headers["retry-after"] == "1"
        release.set()
        assert (await first).status_code == 200 and (await second).status_code == 200
        assert metric(router, 'tokenmill:router_rejected_total{reason="queue_full"} 1.0')


async def test_passthrough_endpoints_and_info():
    def handler(name, request):
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "m"}]})
        return httpx.Response(200, json={"tokens": [1, 2]})

    async with routed(handler) as (client, _):
        assert (await client.get("/v1/models")).json()["data"][0]["id"] == "m"
        assert (await client.post("/tokenize", json={"prompt": "x"})).json()["tokens"] == [1, 2]
        assert (await client.get("/health")).status_code == 200
        info = (await client.get("/router_info")).json()
        assert {r["name"] for r in info["replicas"]} == {GOOD, BAD}
        text = (await client.get("/metrics")).text
        assert "tokenmill:router_replica_healthy" in text


async def test_a_reset_alone_does_not_take_a_healthy_replica_out():
    def handler(name, request):
        if name == BAD:  # e.g. a keep-alive connection the replica was closing
            raise httpx.RemoteProtocolError("Server disconnected", request=request)
        return httpx.Response(200, json=OK_JSON)

    async with routed(handler) as (client, router):
        for _ in range(2):
            r = await client.post("/v1/completions", json=BODY)
            assert r.status_code == 200 and r.headers["x-tokenmill-replica"] == GOOD
        await asyncio.sleep(0.1)  # the triggered health check passes
        assert len(router.healthy()) == 2


@pytest.mark.parametrize(
    "info", [b"<html>oops</html>", b'{"engine": [1]}', b'{"engine": {"block_size": "16k"}}']
)
async def test_a_replica_with_a_bad_server_info_still_serves(info):
    """/health says it serves; a /server_info the router cannot read made every health
    check raise (swallowed by the loop): the replica never came up."""
    async with serve(lambda n, r: httpx.Response(200, json=OK_JSON), server_info=info) as fake:
        assert len(fake.router.healthy()) == 2
        assert {r.block_size for r in fake.router.replicas.values()} == {16}
        assert (await fake.client.post("/v1/completions", json=BODY)).status_code == 200
