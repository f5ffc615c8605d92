"""One generation request through the gateway: model allowlist, limits and budget, input
guardrails, then the inner app with the (possibly redacted) body, its response rewritten
on the way out (output guardrails, tool policy, usage shown as the client asked), and one
ledger row journaled before the response's last byte leaves."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from tokenmill.gateway.captured import CapturedResponse, send_whole
from tokenmill.gateway.endpoints.common import ExchangeContext, blocked_message
from tokenmill.gateway.guardrails import check_input
from tokenmill.gateway.guardrails.decision import masked
from tokenmill.gateway.jsonio import dumps, loads
from tokenmill.gateway.limits import Admission, Rejection
from tokenmill.gateway.sse import Event, SSEParser
from tokenmill.gateway.store.keys_table import StoredKey
from tokenmill.gateway.store.records import GuardrailEvent, ToolCallEvent, UsageRecord
from tokenmill.gateway.tool_policy import declared_tools
from tokenmill.openai.errors import error_body

logger = logging.getLogger("tokenmill.gateway")

MAX_BUFFERED_RESPONSE = 256 * 1024 * 1024
_ESTIMATE_MAX_TOKENS = 256  # a request without max_tokens is budgeted at this many


def json_response(status: int, payload: dict[str, Any], headers: list | None = None):
    body = dumps(payload)
    start = {
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *(headers or []),
        ],
    }
    return start, {"type": "http.response.body", "body": body, "more_body": False}


def error_envelope(message: str, type_: str, code: str | None, param: str | None = None) -> dict:
    return error_body(message, type_, param, code)


class Exchange:
    def __init__(self, gateway, adapter, scope, receive, send, key: StoredKey) -> None:
        self.gw = gateway
        self.config = gateway.config  # one snapshot for the whole request
        self.adapter = adapter
        self.scope = scope
        self.receive = receive
        self.send = send
        self.key = key
        self.request_id = (
            (scope.get("state") or {}).get("request_id")
            or _header(scope, b"x-request-id")
            or gateway.new_request_id()
        )
        self.started = time.monotonic()
        self.ctx: ExchangeContext | None = None
        self.admission: Admission | None = None
        self.status = 0
        self.recorded = False
        self.finished = False  # our last message went out: the app's later sends are dropped
        self.client_gone = False
        self.cut = asyncio.Event()
        self.body: dict[str, Any] = {}
        self.body_size = 0

    # ------------------------------------------------------------ entry

    async def run(self) -> None:
        try:
            body_bytes = await self._read_body()
        except ValueError as e:
            return await self._reply(
                413, error_envelope(str(e), "invalid_request_error", "body_too_large")
            )
        body = _parse(body_bytes)
        parsed = body is not None
        body = body or {}
        model = body.get("model") if isinstance(body.get("model"), str) else ""
        self.body = body
        self.ctx = self._context(body, model)
        if not await self._admit(body, model, parsed):
            return
        try:
            if parsed:
                body_bytes = await self._input_guardrails(body, body_bytes)
            # else the app answers with its precise 400 (metered as such, limits applied)
            if body_bytes is None:
                return
            self.gw.metrics.admission_seconds.observe(time.monotonic() - self.started)
            await self._forward(body_bytes, body)
        finally:
            self._finish_record()

    def _context(self, body: dict[str, Any], model: str) -> ExchangeContext:
        return self.gw.context(
            self.config, self.key, self.adapter.endpoint, model,
            stream=body.get("stream") is True, tools=declared_tools(body),
            request_id=self.request_id,
        )  # fmt: skip

    # ------------------------------------------------------------ admission

    async def _admit(self, body: dict[str, Any], model: str, parsed: bool) -> bool:
        """False when the request may not run (the rejection was sent)."""
        key, ctx = self.key, self.ctx
        if parsed and key.models is not None and model not in key.models:
            await self._reject(403, error_envelope(
                f"this key may not use model {model!r}", "permission_error", "model_not_allowed", "model"))  # fmt: skip
            return False
        if self.adapter.endpoint == "responses" and body.get("background") is True:
            await self._reject(400, error_envelope(
                "background responses are not available through the gateway (they could not be "
                "metered)", "invalid_request_error", "background_not_supported", "background"))  # fmt: skip
            return False
        if ctx.stream and self.gw.output_rules_modify and self.adapter.wants_logprobs(body):
            await self._reject(400, error_envelope(
                "logprobs are not available on streamed output under output guardrails that can "
                "change the text", "invalid_request_error", "logprobs_unavailable", "logprobs"))  # fmt: skip
            return False
        await self.gw.limiter.load_budget(key, time.time())
        price = self.config.price(model)
        max_tokens = next(
            (
                body[k]
                for k in ("max_tokens", "max_completion_tokens", "max_output_tokens")
                if k in body
            ),
            None,
        )
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
            max_tokens = _ESTIMATE_MAX_TOKENS
        # the most it can cost: a prompt has at most one token per byte of its body
        estimate = price.cost(self.body_size, 0, min(max_tokens, 1 << 20))
        verdict = self.gw.limiter.admit(key, self.config.defaults, estimate)
        if isinstance(verdict, Rejection):
            headers = (
                [(b"retry-after", str(verdict.retry_after).encode())] if verdict.retry_after else []
            )
            await self._reject(
                verdict.status, error_envelope(verdict.message, verdict.type, verdict.code), headers
            )
            return False
        self.admission = verdict
        self.gw.metrics.requests.labels("admitted").inc()
        return True

    async def _reject(
        self, status: int, payload: dict[str, Any], headers: list | None = None
    ) -> None:
        self.status = status
        self.ctx.error_code = payload["error"].get("code")
        self.gw.metrics.requests.labels(payload["error"].get("code") or str(status)).inc()
        self._finish_record()
        await self._reply(status, payload, headers)

    # ------------------------------------------------------------ input

    async def _input_guardrails(self, body: dict[str, Any], body_bytes: bytes) -> bytes | None:
        """The body to send on (None: answered here: blocked or a fallback)."""
        ctx, adapter = self.ctx, self.adapter
        if self.gw.has_input_rules:
            refs = adapter.input_texts(body)
            if refs is None:
                await self._reject(400, error_envelope(
                    "prompts given as token ids cannot be checked by the input guardrails",
                    "invalid_request_error", "unscannable_input", "prompt"))  # fmt: skip
                return None
            texts = [r.text for r in refs]
            verdict = await check_input(self.config.guardrails, texts, judge=ctx.judge)
            ctx.decisions.extend(verdict.decisions)
            if verdict.blocked is not None:
                await self._reject(400, error_envelope(
                    blocked_message(verdict.blocked), "invalid_request_error", "guardrail_blocked"))  # fmt: skip
                return None
            if verdict.fallback is not None and getattr(adapter, "blocks_on_fallback", False):
                await self._reject(400, error_envelope(
                    blocked_message(verdict.fallback), "invalid_request_error", "guardrail_blocked"))  # fmt: skip
                return None
            if verdict.fallback is not None:
                await self._fallback(body, verdict.replacement or "")
                return None
            changed = False
            for ref, text in zip(refs, verdict.texts, strict=True):
                if text != ref.text:
                    ref.set(text)
                    changed = True
            if changed:
                body_bytes = b""
        if ctx.stream:
            adapter.prepare_stream(body, ctx)
            body_bytes = b""
        return body_bytes or dumps(body)

    async def _fallback(self, body: dict[str, Any], text: str) -> None:
        ctx = self.ctx
        ctx.finish_reason = "content_filter"
        self.status = 200
        if ctx.stream:
            self.adapter.prepare_stream(body, ctx)
            events = self.adapter.fallback_events(body, text, ctx)
            ctx.output_started()
            self._finish_record()
            await self.send(
                {"type": "http.response.start", "status": 200, "headers": _sse_headers()}
            )
            await self.send(
                {
                    "type": "http.response.body",
                    "body": b"".join(e.encode() for e in events),
                    "more_body": False,
                }
            )
        else:
            self._finish_record()
            start, msg = json_response(200, self.adapter.fallback_json(body, text, ctx))
            await self.send(start)
            await self.send(msg)

    # ------------------------------------------------------------ the inner app

    async def _read_body(self) -> bytes:
        limit = self.gw.max_body_bytes
        chunks, size = [], 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self.client_gone = True
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise ValueError(f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        self.body_size = size
        return b"".join(chunks)

    async def _inner_receive(self, body: bytes, sent: list[bool]) -> dict[str, Any]:
        if not sent[0]:
            sent[0] = True
            return {"type": "http.request", "body": body, "more_body": False}
        if self.cut.is_set() or self.client_gone:
            return {"type": "http.disconnect"}
        real = asyncio.ensure_future(self.receive())
        cut = asyncio.ensure_future(self.cut.wait())
        try:
            await asyncio.wait((real, cut), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (real, cut):
                if not t.done():
                    t.cancel()
        if real.done() and not real.cancelled():
            message = real.result()
            if message["type"] == "http.disconnect":
                self.client_gone = True
            return message
        return {"type": "http.disconnect"}

    async def _forward(self, body: bytes, parsed: dict[str, Any] | None) -> None:
        sent = [False]
        scope = dict(self.scope)
        scope["headers"] = [
            (k, v)
            for k, v in self.scope["headers"]
            if k not in (b"authorization", b"content-length")
        ]
        scope["headers"].append((b"content-length", str(len(body)).encode()))
        relay = _Relay(self)
        try:
            await self.gw.app(scope, lambda: self._inner_receive(body, sent), relay.send)
        except OSError:
            self.client_gone = True
        except Exception:  # the app failed: the client still gets a clean end
            logger.exception("gateway: request %s failed in the app", self.request_id)
            self.ctx.error_code = self.ctx.error_code or "internal_error"
            if not relay.started and not self.finished:
                self.status = 500
                self._finish_record()
                await self._reply(500, error_envelope(
                    f"internal server error (request id {self.request_id})",
                    "internal_server_error", None))  # fmt: skip
        finally:
            if not self.finished and relay.started and not self.client_gone:
                await relay.close()

    async def _reply(
        self, status: int, payload: dict[str, Any], headers: list | None = None
    ) -> None:
        start, msg = json_response(status, payload, headers)
        self.finished = True
        await self.send(start)
        await self.send(msg)

    async def client_send(self, message: dict[str, Any]) -> None:
        try:
            await self.send(message)
        except OSError:  # the client left (ASGI 2.4 servers say so here): the app stops too
            self.client_gone = True
            self.cut.set()
            raise

    # ------------------------------------------------------------ the ledger

    def _finish_record(self) -> None:
        if self.recorded or self.ctx is None:
            return
        self.recorded = True
        ctx, key, gw = self.ctx, self.key, self.gw
        prompt, cached, completion = self.adapter.tokens(ctx.usage)
        cost = self.config.price(ctx.model).cost(prompt, cached, completion)
        if self.admission is not None:
            gw.limiter.finish(self.admission, prompt + completion, cost)
        status = self.status or (499 if self.client_gone else 500)
        if self.client_gone and not self.finished:
            status = 499
        now = time.time()
        gw.record(
            UsageRecord(
                request_id=self.request_id,
                key_id=key.id,
                team=key.team,
                user_name=key.user_name,
                model=ctx.model,
                endpoint=ctx.endpoint,
                prompt_tokens=prompt,
                cached_tokens=cached,
                completion_tokens=completion,
                cost_usd=cost,
                ttft_s=None if ctx.first_output is None else ctx.first_output - self.started,
                latency_s=time.monotonic() - self.started,
                status=status,
                finish_reason=ctx.error_code or ctx.finish_reason,
                created=now,
            )
        )
        for seq, d in enumerate(ctx.decisions):
            gw.metrics.guardrail.labels(d.rule, d.stage, d.action).inc()
            gw.record(GuardrailEvent(request_id=self.request_id, key_id=key.id, seq=seq, stage=d.stage,
                                     rule=d.rule, action=d.action, matched_text=f"{d.label}: {masked(d.matched_text)}",
                                     created=now))  # fmt: skip
        for seq, call in enumerate(ctx.tool_calls):
            gw.metrics.tool_calls.labels("allowed" if call.allowed else "refused").inc()
            gw.record(ToolCallEvent(request_id=self.request_id, key_id=key.id, seq=seq, tool_name=call.name,
                                    arguments=call.arguments, allowed=call.allowed, reason=call.reason,
                                    created=now))  # fmt: skip
        gw.metrics.spend.inc(cost)


class _Relay:
    """The inner app's send, rewritten: JSON bodies whole, event streams event by event."""

    def __init__(self, exchange: Exchange) -> None:
        self.x = exchange
        self.started = False
        self.mode = "pass"
        self.start: dict[str, Any] | None = None
        self.buffer = bytearray()
        self.parser = SSEParser()
        self.rewriter = None

    async def send(self, message: dict[str, Any]) -> None:
        x = self.x
        if x.finished:
            return
        if message["type"] == "http.response.start":
            self.started = True
            x.status = message["status"]
            ctype = next(
                (v for k, v in message.get("headers", []) if k.lower() == b"content-type"), b""
            )
            if ctype.startswith(b"text/event-stream") and x.ctx is not None:
                self.mode = "stream"
                self.rewriter = x.adapter.stream_rewriter(x.body, x.ctx)
                await x.client_send(message)
            elif ctype.startswith(b"application/json") and x.ctx is not None:
                self.mode = "json"
                self.start = message
            else:
                await x.client_send(message)
            return
        if message["type"] != "http.response.body":
            return await x.client_send(message)
        more = message.get("more_body", False)
        chunk = message.get("body", b"")
        if self.mode == "json":
            self.buffer += chunk
            if len(self.buffer) > MAX_BUFFERED_RESPONSE:
                raise RuntimeError("response too large for the gateway")
            if not more:
                await self._send_json()
            return
        if self.mode == "stream":
            events = []
            for event in self.parser.feed(chunk):
                events.extend(await self.rewriter.on_event(event))
            if not more:
                for event in self.parser.rest():
                    events.extend(await self.rewriter.on_event(event))
            await self._send_events(events, final=not more or self.rewriter.cut)
            return
        if not more:
            x.finished = True
            x._finish_record()
        await x.client_send(message)

    async def _send_events(self, events: list[Event], final: bool) -> None:
        x = self.x
        data = b"".join(e.encode() for e in events)
        if final:
            x.finished = True
            if self.rewriter is not None and self.rewriter.cut:
                x.cut.set()  # the app stops generating
            x._finish_record()  # journaled before the last byte goes
            await x.client_send({"type": "http.response.body", "body": data, "more_body": False})
        elif data:
            await x.client_send({"type": "http.response.body", "body": data, "more_body": True})

    async def _send_json(self) -> None:
        x = self.x
        obj = _parse(bytes(self.buffer))
        status, body = x.status, bytes(self.buffer)
        if obj is not None and 200 <= status < 300:
            out = await x.adapter.transform_json(obj, x.ctx)
            if out is None:  # blocked by an output rule
                decision = next(d for d in reversed(x.ctx.decisions) if d.action == "block")
                status = x.status = 400
                body = dumps(
                    error_envelope(
                        blocked_message(decision), "invalid_request_error", "guardrail_blocked"
                    )
                )
            else:
                body = dumps(out)
        elif obj is not None and isinstance(obj.get("error"), dict):
            x.ctx.error_code = obj["error"].get("code") or obj["error"].get("type")
        headers = [
            (k, v) for k, v in self.start.get("headers", []) if k.lower() != b"content-length"
        ]
        headers.append((b"content-length", str(len(body)).encode()))
        x.finished = True
        x._finish_record()
        await x.client_send({**self.start, "status": status, "headers": headers})
        await x.client_send({"type": "http.response.body", "body": body, "more_body": False})

    async def close(self) -> None:
        """The app stopped without ending its body (an error): end it cleanly."""
        x = self.x
        if self.mode == "stream":
            events = [
                Event(error_envelope("the response ended early", "server_error", "upstream_error"))
            ]
            if x.adapter.endpoint != "responses":
                events.append(Event("[DONE]"))
            await self._send_events(events, final=True)
        elif self.mode == "json" and self.start is not None:
            await self._send_json()


def _parse(data: bytes) -> dict[str, Any] | None:
    try:
        obj = loads(data)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def _header(scope, name: bytes) -> str | None:
    for k, v in scope.get("headers") or []:
        if k == name:
            return v.decode("latin-1")[:200] or None
    return None


def _sse_headers() -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


async def filtered_read(gw, adapter, scope, receive, send, key: StoredKey) -> None:
    """A stored object read back (GET /v1/responses/{id}): the same output filters and tool
    policy as when it was made, so a redacted answer stays redacted. Nothing is metered."""
    reply = CapturedResponse()
    headers = [(k, v) for k, v in scope["headers"] if k != b"authorization"]
    await gw.app({**scope, "headers": headers}, receive, reply.send)
    out = reply.body
    obj = _parse(out)
    if obj is not None and 200 <= reply.status < 300:
        model = str(obj.get("model", ""))
        ctx = gw.context(
            gw.config, key, adapter.endpoint, model, stream=False, tools=declared_tools(obj)
        )
        filtered = await adapter.transform_json(obj, ctx)
        if filtered is None:
            reply.status = 400
            out = dumps(
                error_envelope(
                    "the stored output is blocked by policy",
                    "invalid_request_error",
                    "guardrail_blocked",
                )
            )
        else:
            out = dumps(filtered)
    await send_whole(send, reply.status, reply.headers, out)
