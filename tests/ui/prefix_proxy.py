"""A tiny reverse proxy that serves a backend under a path prefix (as nginx would with
`location /tm/ { proxy_pass http://backend/; }`), streaming both ways: the UI must work
there with relative URLs only."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import uvicorn

from tests.server.conftest import free_port

_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"host", b"content-length"}


class PrefixProxy:
    def __init__(self, backend: str, prefix: str = "/tm") -> None:
        self.backend = backend.rstrip("/")
        self.prefix = prefix
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}{prefix}"
        self.seen: list[str] = []  # every path asked of the proxy
        config = uvicorn.Config(
            self.app, port=self.port, log_level="warning", lifespan="off", interface="asgi3"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> PrefixProxy:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the prefix proxy did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    async def app(self, scope, receive, send) -> None:
        path = scope["path"]
        self.seen.append(path)
        if not path.startswith(self.prefix + "/"):
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b"outside the prefix"})
            return
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        url = self.backend + path[len(self.prefix) :]
        if scope["query_string"]:
            url += "?" + scope["query_string"].decode()
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP]
        async with httpx.AsyncClient(timeout=120) as client:
            request = client.build_request(
                scope["method"], url, headers=headers, content=bytes(body)
            )
            reply = await client.send(request, stream=True)
            try:
                out = [(k, v) for k, v in reply.headers.raw if k.lower() not in _HOP]
                await send(
                    {"type": "http.response.start", "status": reply.status_code, "headers": out}
                )
                async for chunk in reply.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    await asyncio.sleep(0)
                await send({"type": "http.response.body", "body": b""})
            finally:
                await reply.aclose()
