"""What the HTTP handlers share: the engine, the served names, metrics and limits."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request

from tokenmill.engine.async_llm import AsyncLLM, QueueFullError, RequestFailedError
from tokenmill.engine.core_client import EngineDeadError
from tokenmill.outputs import RequestOutput
from tokenmill.server.errors import APIError
from tokenmill.server.metrics import ServerMetrics

access_log = logging.getLogger("tokenmill.access")
T = TypeVar("T")


@dataclass
class ServerState:
    engine: AsyncLLM
    served_model_names: list[str]
    metrics: ServerMetrics
    api_key: str | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    started: float = field(default_factory=time.time)
    draining: bool = False
    _compiler: Any = None

    @property
    def grammar_compiler(self):
        """Validates output constraints in the API process (400 before the engine sees them)."""
        if self._compiler is None:
            from tokenmill.structured.grammar import GrammarCompiler

            self._compiler = GrammarCompiler(
                self.engine.tokenizer, self.engine.engine_info["vocab_size"]
            )
        return self._compiler

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    def check_model(self, name: str | None) -> str:
        if name is not None and name not in self.served_model_names:
            raise APIError(
                404,
                f"The model `{name}` does not exist. Available models: {', '.join(self.served_model_names)}",
                "invalid_request_error",
                "model",
                "model_not_found",
            )
        return self.model_name


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def engine_error(e: Exception, request_id: str) -> APIError:
    """Maps engine-side failures to HTTP errors (client mistakes were caught before)."""
    if isinstance(e, QueueFullError):
        return APIError(
            503, str(e), "server_error", None, "server_busy", headers={"Retry-After": "1"}
        )
    if isinstance(e, EngineDeadError):
        return APIError(503, f"engine unavailable: {e}", "server_error", None, "engine_dead")
    if isinstance(e, RequestFailedError):
        return APIError(
            500,
            f"request {request_id} failed in the engine: {e}",
            "internal_server_error",
            None,
            "engine_error",
        )
    if isinstance(e, ValueError):
        from tokenmill.server.errors import from_value_error

        return from_value_error(e)
    raise e


async def until_disconnect(raw: Request, work: Awaitable[T], poll_s: float = 0.2) -> T:
    """Runs `work`, cancelling it if the client goes away (non-streaming requests)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            if await raw.is_disconnected():
                task.cancel()
                raise asyncio.CancelledError("client disconnected")
    finally:
        if not task.done():
            task.cancel()


def sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


def stream_chunk(
    completion_id: str,
    obj: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    include_usage: bool,
) -> str:
    """One SSE chunk; with include_usage every chunk carries `usage` (null until the last)."""
    body: dict[str, Any] = {
        "id": completion_id,
        "object": obj,
        "created": created,
        "model": model,
        "choices": choices,
    }
    if include_usage:
        body["usage"] = usage
    return sse(body)


async def final_output(gen: AsyncIterator[RequestOutput]) -> RequestOutput:
    final = None
    async for out in gen:
        final = out
    if final is None:
        raise RuntimeError("the engine returned no output")
    return final


async def sse_with_errors(chunks: AsyncIterator[str], request_id: str) -> AsyncIterator[str]:
    """Ends a stream that fails mid-way with an error event and [DONE], never a hang."""
    try:
        async for chunk in chunks:
            yield chunk
    except (QueueFullError, EngineDeadError, RequestFailedError, ValueError) as e:
        err = engine_error(e, request_id)
        yield sse(err.body())
    except Exception as e:  # a real fault: still a clean end of stream
        logging.getLogger(__name__).exception("stream %s failed", request_id)
        yield sse(
            APIError(
                500,
                f"internal error (request {request_id}): {type(e).__name__}",
                "internal_server_error",
            ).body()
        )
    yield sse("[DONE]")


def log_request(**fields: Any) -> None:
    access_log.info(json.dumps(fields, default=str))
