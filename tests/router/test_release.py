"""Bookings and admission slots are released on every way out of a request: success,
replica errors, retries, mid-stream failures, client disconnects, cancellation, and
request ids the client repeats."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest
from fastapi import Request

from tests.router.fakes import (
    BAD,
    BODY,
    GOOD,
    OK_JSON,
    SSE,
    Chunks,
    body_chunks,
    post_raw,
    serve,
    sse_ok,
)
from tokenmill.router.app import unless_client_leaves
from tokenmill.router.proxy import UpstreamStream

pytestmark = pytest.mark.anyio


def released(fake) -> None:
    for name in (GOOD, BAD):
        loads = fake.router.loads
        assert loads.in_flight(name) == 0, name
        assert loads.active_blocks(name) == 0, name
        assert loads.pending_prefill(name) == 0, name


async def admitted(fake) -> int:
    return (await fake.client.get("/router_info")).json()["in_flight"]


async def test_mixed_load_with_one_request_id_returns_to_zero():
    """Concurrent requests that all carry the same X-Request-Id, with every kind of outcome;
    some clients leave mid-stream. Afterwards nothing is booked or admitted."""
    turn = [0]
    peak = [0]
    hold = asyncio.Event()

    async def handler(name, request):
        turn[0] += 1
        peak[0] = max(peak[0], fake.in_flight())
        await asyncio.sleep(0.01 * (turn[0] % 3))  # overlap the bookings
        kind = turn[0] % 6
        if kind == 0 and json.loads(request.content).get("stream"):
            return httpx.Response(200, headers=SSE, stream=Chunks(sse_ok()))
        if kind == 0:
            return httpx.Response(200, json=OK_JSON)
        if kind == 1:
            return httpx.Response(503, json={"error": {"message": "busy"}})
        if kind == 2:
            raise httpx.RemoteProtocolError("Server disconnected", request=request)
        if kind == 3:
            return httpx.Response(200, stream=Chunks([b'{"cho'], httpx.ReadError("reset")))
        if kind == 4:
            fail = httpx.RemoteProtocolError("peer closed connection")
            return httpx.Response(200, headers=SSE, stream=Chunks([b"data: {}\n\n"], fail))
        return httpx.Response(200, headers=SSE, stream=Chunks([b"data: {}\n\n"], gate=hold))

    def leave_after_first_chunk(messages: list[dict]) -> bool:
        return bool(body_chunks(messages))

    async with serve(handler) as fake:
        rid = {"x-request-id": "same-id"}
        body = {**BODY, "stream": True}
        clients = [
            fake.client.post("/v1/completions", json=BODY if i % 2 else body, headers=rid)
            for i in range(30)
        ]
        leavers = [
            post_raw(
                fake.app,
                "/v1/completions",
                json.dumps(body).encode(),
                leave_after_first_chunk,
                ((b"x-request-id", b"same-id"),),
            )  # fmt: skip
            for _ in range(6)
        ]

        async def finish_held_streams() -> None:
            await asyncio.sleep(0.3)
            hold.set()

        results = await asyncio.gather(*clients, *leavers, finish_held_streams())
        codes = {r.status_code for r in results[:30]}
        assert codes <= {200, 502, 503} and 200 in codes
        assert peak[0] > 1  # bookings with the same id did overlap
        released(fake)
        assert await admitted(fake) == 0


async def test_cancelled_request_releases_its_booking():
    """The request's task is cancelled while the replica works (server shutdown, a timeout
    around the app): the booking goes with it."""
    entered = asyncio.Event()

    async def handler(name, request):
        entered.set()
        await asyncio.Event().wait()  # never answers

    async with serve(handler) as fake:
        task = asyncio.create_task(post_raw(fake.app, "/v1/completions", json.dumps(BODY).encode()))
        await entered.wait()
        assert fake.in_flight() == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        released(fake)
        assert await admitted(fake) == 0


@pytest.mark.parametrize("stream", [False, True])
async def test_client_leaving_before_the_reply_cancels_it_at_the_replica(stream):
    """A non-streamed request (or a stream before its first token) whose client leaves: the
    request to the replica is cancelled (its connection closed, so the engine aborts and
    frees its blocks), and the router's booking and slot go at once."""
    entered, cancelled = asyncio.Event(), asyncio.Event()

    async def handler(name, request):
        entered.set()
        try:
            await asyncio.Event().wait()  # a long generation
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with serve(handler) as fake:
        gone = asyncio.Event()
        body = json.dumps({**BODY, "stream": stream}).encode()
        task = asyncio.create_task(post_raw(fake.app, "/v1/completions", body, gone=gone))
        await entered.wait()
        gone.set()
        await asyncio.wait_for(task, 2)
        assert cancelled.is_set()
        released(fake)
        assert await admitted(fake) == 0
        text = (await fake.client.get("/metrics")).text
        assert "tokenmill:router_client_disconnects_total 1.0" in text


async def test_stream_cancelled_mid_way_releases_before_closing_the_replica():
    """Cancelled by a cancel scope mid-stream, every await in the cleanup is cancelled too:
    the booking and the slot must be released before the upstream response is closed."""
    stream = Chunks([b"data: {}\n\n"], gate=asyncio.Event())

    def handler(name, request):
        return httpx.Response(200, headers=SSE, stream=stream)

    async with serve(handler) as fake:
        with anyio.CancelScope() as scope:

            def leave(messages: list[dict]) -> bool:
                if body_chunks(messages):
                    scope.cancel()
                return False

            body = json.dumps({**BODY, "stream": True}).encode()
            await post_raw(fake.app, "/v1/completions", body, leave)
        assert scope.cancelled_caught
        released(fake)
        assert await admitted(fake) == 0


async def test_headers_are_forwarded_as_the_bytes_the_client_sent():
    """Header values outside ASCII (latin-1 on the wire) used to make httpx raise while
    building the upstream request: a 500, and a booking that was never released."""
    seen: list[bytes] = []

    def handler(name, request):
        seen.append(request.headers.raw)
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"tokens": [1]})
        return httpx.Response(200, json=OK_JSON)

    async with serve(handler) as fake:
        headers = {"user-agent": "caf\xe9".encode("latin-1"), "x-request-id": b"r\xe9q"}
        r = await fake.client.post("/v1/completions", json=BODY, headers=headers)
        assert r.status_code == 200 and r.headers.raw[-1] != b""
        assert (b"user-agent", b"caf\xe9") in seen[-1] and (b"x-request-id", b"r\xe9q") in seen[-1]
        r = await fake.client.post("/tokenize", json={"prompt": "x"}, headers=headers)
        assert r.status_code == 200 and (b"user-agent", b"caf\xe9") not in seen[-1]
        released(fake)


async def test_a_burst_of_resets_asks_for_one_health_check():
    """Each reset used to start its own health check of the replica: a burst of failed
    requests, as many concurrent checks."""
    gate = asyncio.Event()

    def handler(name, request):
        if name == BAD:
            raise httpx.RemoteProtocolError("Server disconnected", request=request)
        return httpx.Response(200, json=OK_JSON)

    async with serve(handler, health_gate=gate) as fake:
        before = fake.health_calls[BAD]
        results = await asyncio.gather(
            *(fake.client.post("/v1/completions", json=BODY) for _ in range(20))
        )
        assert all(r.status_code == 200 for r in results)
        await asyncio.sleep(0.05)
        assert fake.health_calls[BAD] - before == 1  # one check, still waiting on the gate
        gate.set()
        await asyncio.sleep(0.05)
        assert len(fake.router.healthy()) == 2
        released(fake)


async def test_a_stream_ready_when_the_handler_is_cancelled_is_released():
    """The reply (a stream that owns a booking and the slot) is ready, but the handler is
    cancelled before it resumes to send it: the stream must still be cleaned up."""
    released_by: list[str] = []

    async def cleanup() -> None:
        released_by.append("cleanup")

    async def empty() -> AsyncIterator[bytes]:
        yield b""

    async def receive() -> dict:
        await asyncio.Event().wait()
        return {}

    request = Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)

    async def work() -> UpstreamStream:
        handler.cancel()  # lands before the handler sees the reply
        return UpstreamStream(empty(), cleanup)

    handler = asyncio.create_task(unless_client_leaves(request, work()))
    with pytest.raises(asyncio.CancelledError):
        await handler
    assert released_by == ["cleanup"]
