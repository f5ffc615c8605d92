"""Running responses: to the end (one JSON object), as typed SSE events, or in the background
(queued, polled with GET, cancellable). All three build their output with OutputBuilder and
save the final object to the store (when `store` is on)."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from tokenmill.engine.async_llm import OutputStream
from tokenmill.openai import responses_objects as ro
from tokenmill.openai.responses_protocol import ResponsesRequest
from tokenmill.outputs import RequestOutput
from tokenmill.server.errors import bad_request
from tokenmill.server.generation import final_outputs, submit
from tokenmill.server.responses.objects import usage
from tokenmill.server.responses.output import Event, OutputBuilder
from tokenmill.server.responses.prepare import Prepared, not_found, prepare
from tokenmill.server.responses.store import ResponseStore
from tokenmill.server.state import ServerState, engine_error, off_loop, sse

logger = logging.getLogger(__name__)

_STATUS = {"length": "incomplete", "abort": "cancelled"}  # else completed
_TERMINAL = {"completed", "incomplete", "failed", "cancelled"}


# A response's error.code for failures the HTTP API names with its own code: a full queue
# is OpenAI's "try later"; a dead engine core says so (retrying does not help).
_CODES = {"server_busy": "rate_limit_exceeded", "engine_dead": "engine_dead"}


def _error(e: BaseException, request_id: str) -> tuple[str, str]:
    """(code, message) of a failure, for the response object's `error`."""
    try:
        err = engine_error(e, request_id)  # type: ignore[arg-type]
    except BaseException:
        logger.exception("response %s failed", request_id)
        return "server_error", f"internal error (request {request_id}): {type(e).__name__}"
    code = _CODES.get(err.code or "")
    if code is None:
        code = "invalid_prompt" if err.status < 500 else "server_error"
    return code, err.message


class ResponsesService:
    def __init__(self, state: ServerState, store: ResponseStore | None) -> None:
        self.state = state
        self.store = store
        self.tasks: dict[str, asyncio.Task] = {}  # background responses running here
        self.closing = False

    # ------------------------------------------------------------ create

    async def create(self, req: ResponsesRequest, raw: Request, owner: str, request_id: str):
        p = await prepare(self.state, self.store, req, owner, request_id)
        if req.background:
            return JSONResponse(await self._start_background(p))
        stream = await submit(self.state.engine, [p.generation], request_id)
        if req.stream:
            return StreamingResponse(
                self._events(p, stream, request_id),
                media_type="text/event-stream",
                headers={"X-Request-Id": request_id},
            )
        final = (await final_outputs(raw, stream, request_id))[p.obj.id]
        self._finish(p, final)
        await self._save(p)
        return JSONResponse(p.obj.to_dict(), headers={"X-Request-Id": request_id})

    def _finish(self, p: Prepared, final: RequestOutput) -> None:
        c = final.outputs[0]
        builder = OutputBuilder(p.parse_tools, p.parallel)
        builder.feed(c.text)
        builder.finish(c.finish_reason == "length")
        tokens = len(c.token_ids)
        p.obj.finish(
            _STATUS.get(c.finish_reason or "", "completed"),
            builder.items,
            usage(len(final.prompt_token_ids), tokens, final.num_cached_tokens),
        )
        record = p.record
        record.completion_tokens, record.cached_tokens = tokens, final.num_cached_tokens
        record.first_token = final.metrics.get("first_token_time")
        record.finish_reasons = [c.finish_reason]

    async def _save(self, p: Prepared) -> None:
        """Saves the object as it is now; saves of one response happen in order, and a
        save under way completes even if its caller is cancelled."""
        if p.obj.status in _TERMINAL:
            p.record.write()
        if not p.store or self.store is None:
            return
        body = p.obj.to_dict()
        store = self.store

        async def write() -> None:
            async with p.save_lock:
                await off_loop(store.put, p.owner, body, p.context)

        await asyncio.shield(write())

    # ------------------------------------------------------------ streaming

    async def _events(
        self, p: Prepared, stream: OutputStream, request_id: str
    ) -> AsyncIterator[str]:
        seq = itertools.count()

        def event(ev: Event) -> str:
            return f"event: {ev[ro.TYPE]}\n" + sse({**ev, ro.SEQUENCE_NUMBER: next(seq)})

        obj = p.obj
        yield event(ro.response_event(ro.RESPONSE_CREATED, obj.to_dict()))
        yield event(ro.response_event(ro.RESPONSE_IN_PROGRESS, obj.to_dict()))
        builder = OutputBuilder(p.parse_tools, p.parallel)
        tokens = cached = 0
        reason: str | None = None
        try:
            async for out in stream:
                cached = out.num_cached_tokens
                for c in out.outputs:
                    if c.token_ids:
                        p.record.token()
                    tokens += len(c.token_ids)
                    for ev in builder.feed(c.text):
                        yield event(ev)
                    if c.finished:
                        reason = c.finish_reason
            for ev in builder.finish(reason == "length"):
                yield event(ev)
            obj.finish(
                _STATUS.get(reason or "", "completed"),
                builder.items,
                usage(p.record.prompt_tokens, tokens, cached),
            )
            p.record.completion_tokens, p.record.cached_tokens = tokens, cached
            p.record.finish_reasons = [reason]
        except Exception as e:  # the stream still ends with a terminal event
            obj.fail(*_error(e, request_id))
        finally:
            if not stream.finished:  # the client went away, or a failure
                stream.abort()
        await self._save(p)
        terminal = {"completed": ro.RESPONSE_COMPLETED, "incomplete": ro.RESPONSE_INCOMPLETE}
        yield event(ro.response_event(terminal.get(obj.status, ro.RESPONSE_FAILED), obj.to_dict()))

    # ------------------------------------------------------------ background

    async def _start_background(self, p: Prepared) -> dict[str, Any]:
        p.obj.status = "queued"
        await self._save(p)
        body = p.obj.to_dict()
        rid = p.obj.id
        task = asyncio.create_task(self._run_background(p))
        self.tasks[rid] = task
        task.add_done_callback(lambda _t: self.tasks.pop(rid, None))
        return body

    async def _run_background(self, p: Prepared) -> None:
        rid = p.record.request_id
        stream: OutputStream | None = None
        try:
            stream = await submit(self.state.engine, [p.generation], rid)
            p.obj.status = "in_progress"
            await self._save(p)
            final = (await stream.final_outputs())[p.obj.id]
            self._finish(p, final)
        except asyncio.CancelledError:
            if stream is not None and not stream.finished:
                stream.abort()  # frees its KV blocks now
            if self.closing:
                p.obj.fail("server_error", "the server shut down before the response finished")
            else:
                p.obj.status = "cancelled"
            await self._save(p)
            raise
        except Exception as e:
            if stream is not None and not stream.finished:
                stream.abort()
            p.obj.fail(*_error(e, rid))
        await self._save(p)

    async def _stop(self, response_id: str) -> None:
        task = self.tasks.get(response_id)
        if task is not None:
            task.cancel()
            await asyncio.wait({task})

    async def close(self) -> None:
        """Shutdown: background responses still running end as failed."""
        self.closing = True
        for rid in list(self.tasks):
            await self._stop(rid)

    # ------------------------------------------------------------ stored

    async def retrieve(self, response_id: str, owner: str) -> dict[str, Any]:
        stored = await self.store.aget(response_id, owner) if self.store else None
        if stored is None:
            raise not_found(response_id)
        return stored.response

    async def delete(self, response_id: str, owner: str) -> dict[str, Any]:
        await self.retrieve(response_id, owner)  # someone else's is not stopped either
        await self._stop(response_id)
        if self.store is None or not await self.store.adelete(response_id, owner):
            raise not_found(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    async def cancel(self, response_id: str, owner: str) -> dict[str, Any]:
        """Idempotent: a finished response is returned as it is."""
        response = await self.retrieve(response_id, owner)
        if not response.get("background"):
            raise bad_request("only background responses can be cancelled", "response_id")
        await self._stop(response_id)
        return await self.retrieve(response_id, owner)

    async def input_items(
        self, response_id: str, owner: str, limit: int, order: str, after: str | None
    ) -> dict[str, Any]:
        stored = await self.store.aget(response_id, owner) if self.store else None
        if stored is None:
            raise not_found(response_id)
        items = stored.context if order == "asc" else stored.context[::-1]
        if after is not None:
            ids = [it["id"] for it in items]
            items = items[ids.index(after) + 1 :] if after in ids else []
        page = items[:limit]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit,
        }
