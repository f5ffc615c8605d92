"""What every generation endpoint does with the engine: submit a call's requests, then
either stream their chunks or wait for the final outputs, and log the request once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from tokenmill.engine.async_llm import AsyncLLM, GenerationRequest, OutputStream
from tokenmill.openai import completion_objects as co
from tokenmill.outputs import RequestOutput
from tokenmill.server.state import AccessRecord, engine_error, sse_with_errors, until_disconnect


async def submit(
    engine: AsyncLLM, requests: list[GenerationRequest], request_id: str
) -> OutputStream:
    """All the call's requests admitted at once, or an HTTP error and nothing running."""
    try:
        return await engine.add_requests(requests)
    except (ValueError, RuntimeError) as e:
        raise engine_error(e, request_id) from e


def event_stream(chunks: AsyncIterator[str], request_id: str) -> StreamingResponse:
    return StreamingResponse(
        sse_with_errors(chunks, request_id),
        media_type="text/event-stream",
        headers={"X-Request-Id": request_id},
    )


async def final_outputs(
    raw: Request, stream: OutputStream, request_id: str
) -> dict[str, RequestOutput]:
    """Every request's final output; a client that leaves (or a failure) aborts the rest."""
    try:
        return await until_disconnect(raw, stream.final_outputs())
    except (ValueError, RuntimeError) as e:
        raise engine_error(e, request_id) from e
    finally:
        if not stream.finished:
            stream.abort()


def respond(
    body: dict[str, Any], finals: list[RequestOutput], record: AccessRecord, request_id: str
) -> JSONResponse:
    """The non-streamed response, logged once."""
    _, record.cached_tokens, record.completion_tokens = co.usage_tokens(body[co.USAGE])
    firsts = [f.metrics["first_token_time"] for f in finals if f.metrics.get("first_token_time")]
    record.first_token = min(firsts, default=None)
    record.finish_reasons = [c[co.FINISH_REASON] for c in body[co.CHOICES]]
    record.write()
    return JSONResponse(body, headers={"X-Request-Id": request_id})
