"""The router app in front of fake replicas (httpx MockTransport), and a raw ASGI client
that can leave in the middle of a stream (httpx's ASGITransport reads replies whole)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import httpx
from fastapi import FastAPI

from tokenmill.router.app import build_router_app
from tokenmill.router.config import RouterConfig
from tokenmill.router.prompts import PromptHasher
from tokenmill.router.replicas import ReplicaSpec
from tokenmill.router.router import Router

GOOD, BAD = "127.0.0.1:9101", "127.0.0.1:9102"
BODY = {"model": "m", "prompt": list(range(1, 100)), "max_tokens": 4}
OK_JSON = {"choices": [{"text": "hi"}], "usage": {"prompt_tokens": 99, "completion_tokens": 4,
           "total_tokens": 103, "prompt_tokens_details": {"cached_tokens": 96}}}  # fmt: skip
SSE = {"content-type": "text/event-stream"}

Handler = Callable[[str, httpx.Request], object]


class Chunks(httpx.AsyncByteStream):
    """A replica's body: `chunks`, then `fail` raised; `gate` holds it before the end."""

    def __init__(
        self, chunks: list[bytes], fail: Exception | None = None, gate: asyncio.Event | None = None
    ) -> None:
        self.chunks, self.fail, self.gate = chunks, fail, gate
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for c in self.chunks:
            yield c
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail

    async def aclose(self) -> None:
        await asyncio.sleep(0.01)  # a real connection's release waits, as here
        self.closed = True


def sse_ok() -> list[bytes]:
    return [b'data: {"choices": [{"text": "a"}]}\n\n', b"data: [DONE]\n\n"]


@dataclass
class Fake:
    client: httpx.AsyncClient
    router: Router
    app: FastAPI
    health_calls: Counter[str] = field(default_factory=Counter)

    def in_flight(self) -> int:
        return self.router.loads.total_in_flight()


@contextlib.asynccontextmanager
async def serve(
    handler: Handler,
    dead: set[str] | None = None,
    health_gate: asyncio.Event | None = None,
    hasher: PromptHasher | None = None,
    api_key: str | None = None,
    protect_metrics: bool = False,
    server_info: bytes = b'{"engine": {"block_size": 16, "pid": 1}}',
    **config,
) -> AsyncIterator[Fake]:
    """Names in `dead` refuse health checks; once both replicas are up, health checks wait
    for `health_gate` (when given). Replicas describe themselves with `server_info`."""
    dead = dead if dead is not None else set()
    calls: Counter[str] = Counter()

    async def transport(request: httpx.Request) -> httpx.Response:
        name = f"{request.url.host}:{request.url.port}"
        if request.url.path == "/health":
            calls[name] += 1
            if name in dead:
                raise httpx.ConnectError("refused", request=request)
            if health_gate is not None and len(router.healthy()) == 2:
                await health_gate.wait()
            return httpx.Response(200)
        if request.url.path == "/server_info":
            return httpx.Response(200, content=server_info)
        out = handler(name, request)
        return await out if asyncio.iscoroutine(out) else out

    specs = [ReplicaSpec.parse(GOOD), ReplicaSpec.parse(BAD)]
    router = Router(RouterConfig(**{"health_interval_s": 60, **config}), specs)
    auth = {"api_key": api_key, "protect_metrics": protect_metrics} if api_key else {}
    app = build_router_app(
        router, hasher or PromptHasher(None, None), httpx.MockTransport(transport), **auth
    )
    async with app.router.lifespan_context(app):
        for _ in range(100):
            if len(router.healthy()) == 2:
                break
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app), base_url="http://router"
        ) as client:
            yield Fake(client, router, app, calls)


@contextlib.asynccontextmanager
async def routed(
    handler: Handler, dead: set[str] | None = None, **config
) -> AsyncIterator[tuple[httpx.AsyncClient, Router]]:
    async with serve(handler, dead, **config) as fake:
        yield fake.client, fake.router


async def post_raw(
    app: FastAPI,
    path: str,
    body: bytes,
    leave: Callable[[list[dict]], bool] = lambda _: False,
    headers: tuple[tuple[bytes, bytes], ...] = (),
    gone: asyncio.Event | None = None,
) -> list[dict]:
    """POSTs straight into the ASGI app, as uvicorn would (ASGI 2.3), and disconnects once
    `leave(messages sent so far)` is true or `gone` is set. Returns the messages sent."""
    gone = gone or asyncio.Event()
    messages: list[dict] = []
    request = {"type": "http.request", "body": body, "more_body": False}

    async def receive() -> dict:
        nonlocal request
        if request is not None:
            out, request = request, None
            return out
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        messages.append(message)
        if leave(messages):
            gone.set()

    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1", "method": "POST", "scheme": "http", "path": path,
        "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"host", b"router"), (b"content-type", b"application/json"), *headers],
        "client": ("127.0.0.1", 50000), "server": ("router", 80),
    }  # fmt: skip
    await app(scope, receive, send)
    return messages


def body_chunks(messages: list[dict]) -> list[bytes]:
    return [m["body"] for m in messages if m["type"] == "http.response.body" and m.get("body")]
