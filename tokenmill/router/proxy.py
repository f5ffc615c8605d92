"""Forwarding one request: choose, send, retry once before the first token, stream through.

A replica answers a streamed request's headers only once its first token exists, so any
failure before the headers (connection refused or reset, 502/503/504 such as a dead engine
or a full queue) happened before the first token: the request goes once more to another
replica. Non-streamed responses are read whole before anything is sent, so they retry the
same way. A stream that breaks after its first bytes ends with an OpenAI error event and
`data: [DONE]`; it never hangs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
from fastapi.responses import Response, StreamingResponse

from tokenmill.router.admission import Ticket
from tokenmill.router.disagg import DisaggDecision
from tokenmill.router.prompts import RequestKey
from tokenmill.router.remote_prefill import decode_body, disaggregable, run_prefill
from tokenmill.router.router import Decision, Router
from tokenmill.server.errors import APIError, error_body

logger = logging.getLogger("tokenmill.router")

RETRY_STATUS = frozenset({502, 503, 504})
FORWARD_HEADERS = ("content-type", "authorization", "accept", "x-request-id", "user-agent")
_RETURN_HEADERS = (b"content-type", b"retry-after", b"x-request-id")
_USAGE = re.compile(rb'"prompt_tokens":\s*(\d+).*?"cached_tokens":\s*(\d+)', re.S)


def upstream_headers(
    headers: dict[str, str],
    names: tuple[str, ...],
    request_id: str | None = None,
    api_key: str | None = None,
) -> dict[str, bytes]:
    """The client's headers among `names`, as the bytes it sent (Starlette decodes them as
    latin-1; httpx would encode str as ASCII and fail on anything else). With the replicas'
    `api_key`, the router authenticates itself instead of passing the client's header on."""
    out = {k: v.encode("latin-1") for k, v in headers.items() if k.lower() in names}
    if request_id is not None:
        out["x-request-id"] = request_id.encode("latin-1")
    if api_key is not None:
        out = {k: v for k, v in out.items() if k.lower() != "authorization"}
        out["authorization"] = b"Bearer " + api_key.encode()
    return out


def return_headers(
    resp: httpx.Response, request_id: str, replica: str | None = None
) -> dict[str, str]:
    out = {
        k.decode("latin-1"): v.decode("latin-1")
        for k, v in resp.headers.raw
        if k.lower() in _RETURN_HEADERS
    }
    if request_id:
        out["x-request-id"] = request_id
    if replica:
        out["x-tokenmill-replica"] = replica  # which replica served it (debugging, tests)
    return out


def sse_error(message: str, code: str) -> bytes:
    body = error_body(message, "server_error", None, code)
    return f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n".encode()


class UpstreamStream(StreamingResponse):
    """A StreamingResponse whose cleanup runs even if the client leaves before it starts
    (or, called directly, if it is never sent)."""

    def __init__(self, content: AsyncIterator[bytes], cleanup: Callable[[], Awaitable[None]],
                 **kwargs) -> None:  # fmt: skip
        super().__init__(content, **kwargs)
        self.cleanup = cleanup

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.cleanup()


class Proxy:
    def __init__(
        self,
        router: Router,
        client: httpx.AsyncClient,
        suspect: Callable[[str], None] | None = None,
        api_key: str | None = None,
    ) -> None:
        self.router = router
        self.client = client
        self.metrics = router.metrics
        self.suspect = suspect  # asks for a health check of a replica now
        self.api_key = api_key  # the replicas'
        self.background: set[asyncio.Task] = set()  # remote prefills in flight

    def _failed(self, name: str, e: Exception) -> None:
        """A refused connection means the replica is gone; a reset may also be a stale
        keep-alive connection, so that only triggers an immediate health check."""
        if isinstance(e, httpx.ConnectError):
            self.router.mark_down(name, f"{type(e).__name__}: {e}")
        elif self.suspect is not None and isinstance(e, httpx.TransportError):
            self.suspect(name)

    def _failed_attempt(self, name: str, e: httpx.HTTPError) -> tuple[Response, str]:
        """A replica failed before anything reached the client: the 502 to answer if no
        attempt is left, and the reason to retry."""
        self._failed(name, e)
        self.metrics.requests.labels(name, "transport_error").inc()
        return APIError(
            502, f"replica {name} failed: {type(e).__name__}", "server_error", None,
            "replica_failed",
        ).response(), type(e).__name__  # fmt: skip

    async def forward(
        self,
        path: str,
        body: bytes,
        headers: dict[str, str],
        key: RequestKey | None,
        stream: bool,
        request_id: str,
        ticket: Ticket,
        data: dict[str, Any] | None = None,
    ) -> Response:
        """Sends the request (retrying once before its first token) and returns the reply.
        A stream that starts takes the admission `ticket` over; else the caller releases it.
        With prefill workers, the first attempt may be disaggregated (`data`: the body)."""
        fwd = upstream_headers(headers, FORWARD_HEADERS, request_id, self.api_key)
        tried: list[str] = []
        last: Response | None = None
        retry: str | None = None
        attempts = self.router.config.retries + 1
        for attempt in range(attempts):
            t0 = time.perf_counter()
            decision = self.router.decide(key, request_id, tried, attempt)
            self.metrics.decision_seconds.observe(time.perf_counter() - t0)
            if decision is None:
                break
            tried.append(decision.replica.name)
            sent = body
            if attempt == 0 and disaggregable(data):
                assert data is not None
                dd = self.router.decide_disagg(key, decision, request_id)
                if dd.remote:
                    sent = decode_body(data, dd)
                    self._start_prefill(dd, path, data, fwd)
            if retry is not None:
                self.metrics.retries.labels(retry).inc()
                logger.info("request %s: retry %d on %s", request_id, attempt, tried[-1])
            last, retry = await self._attempt(
                decision, path, sent, fwd, stream, request_id, ticket, t0
            )
            if retry is None:
                return last
        if last is not None:
            return last
        self.metrics.rejected.labels("no_healthy_replica").inc()
        return APIError(
            503, "no healthy replica", "server_error", None, "no_healthy_replica",
            headers={"Retry-After": "1"},
        ).response()  # fmt: skip

    def _start_prefill(self, dd: DisaggDecision, path: str, data: dict[str, Any],
                       headers: dict[str, bytes]) -> None:  # fmt: skip
        task = asyncio.ensure_future(run_prefill(self.router, self.client, dd, path, data, headers))
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def _attempt(
        self,
        decision: Decision,
        path: str,
        body: bytes,
        headers: dict[str, bytes],
        stream: bool,
        request_id: str,
        ticket: Ticket,
        t0: float,
    ) -> tuple[Response, str | None]:
        """One try on the decided replica: (reply, why another replica should retry it).
        Its booking is released on every way out (errors and cancellation included), except
        a stream that started: the stream's cleanup owns it then."""
        name = decision.replica.name
        streaming = False
        try:
            req = self.client.build_request(
                "POST", decision.replica.url + path, content=body, headers=headers
            )
            try:
                resp = await self.client.send(req, stream=True)
            except httpx.HTTPError as e:
                return self._failed_attempt(name, e)
            try:
                if stream and resp.status_code == 200:
                    self.router.first_token(decision)
                    self.metrics.observe_ttft(time.perf_counter() - t0)
                    out = self._stream(resp, decision, request_id, ticket)
                    streaming = True
                    return out, None
                try:
                    content = await resp.aread()
                except httpx.HTTPError as e:  # died while generating; nothing sent yet
                    return self._failed_attempt(name, e)
            finally:
                if not streaming:
                    await resp.aclose()
        finally:
            if not streaming:
                self.router.finish(decision)
        self._count(name, resp.status_code, content)
        out = Response(content, resp.status_code, return_headers(resp, request_id, name))
        return out, str(resp.status_code) if resp.status_code in RETRY_STATUS else None

    def _count(self, name: str, status: int, content: bytes) -> None:
        self.metrics.requests.labels(name, str(status)).inc()
        if status == 200:
            self._usage(name, content)

    def _usage(self, name: str, content: bytes) -> None:
        matches = list(_USAGE.finditer(content[-4096:]))
        if matches:
            m = matches[-1]
            self.metrics.prompt_tokens.labels(name).inc(int(m.group(1)))
            self.metrics.cached_tokens.labels(name).inc(int(m.group(2)))

    def _stream(
        self, resp: httpx.Response, decision: Decision, request_id: str, ticket: Ticket
    ) -> Response:
        """The reply that pumps the replica's stream; it owns the booking, the upstream
        response and (taken over last, once nothing can fail) the admission ticket."""
        name = decision.replica.name
        done = False

        async def cleanup() -> None:
            nonlocal done
            if done:
                return
            done = True
            # release first: a cancelled task may not get past the await below
            self.router.finish(decision)
            held.release()
            await resp.aclose()

        async def pump() -> AsyncIterator[bytes]:
            tail = b""
            problem = None
            try:
                async for chunk in resp.aiter_raw():
                    if chunk:
                        yield chunk
                        tail = (tail + chunk)[-4096:]
                if b"data: [DONE]" not in tail[-64:]:
                    problem = "the replica closed the stream before it finished"
            except httpx.HTTPError as e:
                problem = f"the replica failed mid-stream: {type(e).__name__}"
                self._failed(name, e)
            try:
                if problem is None:
                    self.metrics.requests.labels(name, "200").inc()
                    self._usage(name, tail)
                    return
                logger.warning("request %s on %s: %s", request_id, name, problem)
                self.metrics.stream_errors.labels(name).inc()
                self.metrics.requests.labels(name, "stream_error").inc()
                sep = b"" if not tail or tail.endswith(b"\n\n") else b"\n\n"
                yield sep + sse_error(f"request {request_id}: {problem}", "replica_failed")
            finally:
                await cleanup()

        out = UpstreamStream(
            pump(),
            cleanup,
            status_code=resp.status_code,
            headers=return_headers(resp, request_id, name),
        )
        held = ticket.hand_over()
        return out
