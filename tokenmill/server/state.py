"""What the HTTP handlers share: the engine, the served names, metrics, settings and the
helpers every endpoint uses (errors, disconnects, SSE, access log)."""

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
from tokenmill.openai import completion_objects
from tokenmill.server.cpu_pool import off_loop
from tokenmill.server.errors import APIError, from_value_error
from tokenmill.server.lora import adapters as lora_adapters
from tokenmill.server.metrics import ServerMetrics
from tokenmill.server.settings import ServerSettings

access_log = logging.getLogger("tokenmill.access")
logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class ServerState:
    engine: AsyncLLM
    served_model_names: list[str]
    metrics: ServerMetrics
    settings: ServerSettings = field(default_factory=ServerSettings)
    started: float = field(default_factory=time.time)
    draining: bool = False
    _compiler: Any = None
    _compiler_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def get_grammar_compiler(self):
        """Validates output constraints in the API process (400 before the engine sees
        them): built off the event loop by the first request with a constraint (a few tenths
        of a second: the llguidance tokenizer over the whole vocabulary)."""
        if self._compiler is None:
            async with self._compiler_lock:
                if self._compiler is None:
                    from tokenmill.structured.grammar import GrammarCompiler

                    tokenizer = self.engine.tokenizer
                    vocab_size = self.engine.engine_info["vocab_size"]
                    self._compiler = await off_loop(GrammarCompiler, tokenizer, vocab_size)
        return self._compiler

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    def check_model(self, name: str | None) -> str:
        """The name the response gives: a served name of the base, or a LoRA adapter's."""
        if self.lora_for(name) is not None:
            return name
        if name is not None and name not in self.served_model_names:
            available = [*self.served_model_names, *lora_adapters(self.engine)]
            raise APIError(
                404,
                f"The model `{name}` does not exist. Available models: {', '.join(available)}",
                "invalid_request_error",
                "model",
                "model_not_found",
            )
        return self.model_name

    def lora_for(self, name: str | None) -> str | None:
        """The LoRA adapter a request's `model` names (None: the base model)."""
        if name is None or name in self.served_model_names:
            return None
        return name if name in lora_adapters(self.engine) else None

    def check_accepting(self) -> None:
        """New work (generation, background responses, batches) is refused at once while
        the server drains or its engine core is down."""
        if self.draining:
            raise APIError(
                503,
                "the server is shutting down",
                "server_error",
                None,
                "server_shutting_down",
                headers={"Retry-After": "1"},
            )
        if not self.engine.healthy:
            raise engine_dead(self.engine.dead_reason)


def server_state(request: Request) -> ServerState:
    """The state of the app serving `request` (build_app puts it in app.state.tm)."""
    return request.app.state.tm


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def engine_dead(reason: str | None) -> APIError:
    """503 engine_dead: no retry-after (the engine core does not come back by itself)."""
    reason = reason or "the engine core is not running"
    return APIError(503, f"engine unavailable: {reason}", "server_error", None, "engine_dead")


def engine_error(e: Exception, request_id: str) -> APIError:
    """Maps engine-side failures to HTTP errors (client mistakes were caught before)."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, QueueFullError):
        return APIError(
            503, str(e), "server_error", None, "server_busy", headers={"Retry-After": "1"}
        )
    if isinstance(e, EngineDeadError):
        return engine_dead(str(e))
    if isinstance(e, RequestFailedError):
        return APIError(
            500,
            f"request {request_id} failed in the engine: {e}",
            "internal_server_error",
            None,
            "engine_error",
        )
    if isinstance(e, ValueError):
        return from_value_error(e)
    raise e


class ClientDisconnected(Exception):
    """The client left before its (non-streamed) response was ready."""


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
                raise ClientDisconnected()
    finally:
        if not task.done():
            task.cancel()


# Line breaks to Python's str.splitlines (and so to clients that split SSE with it) that JSON
# leaves unescaped when it keeps non-ASCII text as is.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def sse(data: dict[str, Any] | str) -> str:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text.translate(_LINE_BREAKS)}\n\n"


def stream_chunk(
    completion_id: str,
    obj: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    include_usage: bool,
) -> str:
    """One SSE chunk; with include_usage every chunk carries `usage` (null unless given)."""
    body = completion_objects.chunk(
        completion_objects.envelope(completion_id, obj, created, model), choices
    )
    if include_usage:
        body[completion_objects.USAGE] = usage
    return sse(body)


def usage_options(req: Any) -> tuple[bool, bool]:
    """(usage in the last chunk, usage in every chunk) from `stream_options`."""
    options = req.stream_options
    include = bool(options and options.include_usage)
    return include, include and bool(options.continuous_usage_stats)


async def sse_with_errors(chunks: AsyncIterator[str], request_id: str) -> AsyncIterator[str]:
    """Ends a stream that fails mid-way with an error event and [DONE], never a hang."""
    try:
        async for chunk in chunks:
            yield chunk
    except (QueueFullError, EngineDeadError, RequestFailedError, ValueError) as e:
        yield sse(engine_error(e, request_id).body())
    except Exception as e:  # a real fault: still a clean end of stream
        logger.exception("stream %s failed", request_id)
        yield sse(
            APIError(
                500,
                f"internal error (request {request_id}): {type(e).__name__}",
                "internal_server_error",
            ).body()
        )
    yield sse("[DONE]")


@dataclass
class AccessRecord:
    """One access-log line per generation request (streamed or not)."""

    request_id: str
    completion_id: str
    endpoint: str
    prompt_tokens: int
    started: float = field(default_factory=time.monotonic)
    completion_tokens: int = 0
    cached_tokens: int = 0
    first_token: float | None = None
    finish_reasons: list[str | None] = field(default_factory=list)

    def token(self) -> None:
        if self.first_token is None:
            self.first_token = time.monotonic()

    def write(self) -> None:
        now = time.monotonic()
        ttft = (
            None if self.first_token is None else round((self.first_token - self.started) * 1000, 1)
        )
        access_log.info(
            json.dumps(
                {
                    "request_id": self.request_id,
                    "id": self.completion_id,
                    "endpoint": self.endpoint,
                    "prompt_tokens": self.prompt_tokens,
                    "completion_tokens": self.completion_tokens,
                    "cached_tokens": self.cached_tokens,
                    "ttft_ms": ttft,
                    "latency_ms": round((now - self.started) * 1000, 1),
                    "finish_reason": self.finish_reasons,
                },
                default=str,
            )
        )
