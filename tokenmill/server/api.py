"""The OpenAI-compatible HTTP API (FastAPI). Bodies are parsed by hand so that every client
mistake — bad JSON, wrong content type, wrong types — gets a 4xx in the OpenAI envelope."""

from __future__ import annotations

import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

import tokenmill
from tokenmill.engine.async_llm import AsyncLLM
from tokenmill.model.chat_template import ChatTemplateError
from tokenmill.server.errors import APIError, bad_request, error_body
from tokenmill.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from tokenmill.server.serving_chat import create_chat_completion, render_prompt
from tokenmill.server.serving_completion import create_completion
from tokenmill.server.state import ServerState

logger = logging.getLogger(__name__)

# Paths that need the API key when one is set (health, metrics and version stay open).
_PROTECTED_PREFIXES = ("/v1/", "/tokenize", "/detokenize", "/reset_prefix_cache")


def _param_from_loc(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    # drop pydantic's union-branch tags (e.g. "str", "list[int]")
    return ".".join(
        p
        for p in parts
        if not any(c in p for c in "[]") and p not in ("str", "int", "float", "bool")
    )


def _validation_error(err: ValidationError | RequestValidationError) -> APIError:
    first = err.errors()[0]
    param = _param_from_loc(tuple(first.get("loc", ())))
    msg = first.get("msg", "invalid value")
    return bad_request(f"{param}: {msg}" if param else msg, param=param or None)


async def parse_body(request: Request, model: type[BaseModel], max_bytes: int) -> Any:
    content_type = request.headers.get("content-type", "")
    if "application/json" not in content_type.lower():
        raise APIError(
            415,
            f"Content-Type must be application/json, got {content_type or 'none'!r}",
            "invalid_request_error",
        )
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise APIError(
            413,
            f"request body of {length} bytes exceeds the limit of {max_bytes}",
            "invalid_request_error",
        )
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > max_bytes:
            raise APIError(
                413, f"request body exceeds the limit of {max_bytes} bytes", "invalid_request_error"
            )
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"the body is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise bad_request("the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _validation_error(e) from e


class RequestContextMiddleware:
    """Pure ASGI (streaming and disconnects pass through untouched): assigns the request id,
    echoes it as X-Request-Id, and checks the API key."""

    def __init__(self, app, api_key: str | None) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        request_id = headers.get(b"x-request-id", b"").decode("latin-1")[:200] or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        rid_header = (b"x-request-id", request_id.encode("latin-1"))

        authorized = (
            headers.get(b"authorization", b"").decode("latin-1") == f"Bearer {self.api_key}"
        )
        if self.api_key and scope["path"].startswith(_PROTECTED_PREFIXES) and not authorized:
            body = json.dumps(
                error_body(
                    "Incorrect or missing API key.",
                    "invalid_request_error",
                    None,
                    "invalid_api_key",
                )
            ).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [(b"content-type", b"application/json"), rid_header],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return None

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                existing = [
                    h for h in message.get("headers", []) if h[0].lower() != b"x-request-id"
                ]
                message = {**message, "headers": [*existing, rid_header]}
            await send(message)

        return await self.app(scope, receive, send_with_id)


def build_app(engine: AsyncLLM, served_model_names: list[str], metrics, api_key: str | None = None,
              max_body_bytes: int = 4 * 1024 * 1024) -> FastAPI:  # fmt: skip
    state = ServerState(engine, served_model_names, metrics, api_key, max_body_bytes)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        state.draining = True
        await engine.shutdown()

    app = FastAPI(title="tokenmill", version=tokenmill.__version__, lifespan=lifespan)
    app.state.tm = state

    app.add_middleware(RequestContextMiddleware, api_key=api_key)

    @app.exception_handler(APIError)
    async def api_error(_request: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError):
        return _validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException):
        kind = {404: "not_found_error", 405: "invalid_request_error"}.get(
            exc.status_code, "invalid_request_error"
        )
        message = {404: "no such endpoint", 405: "method not allowed"}.get(
            exc.status_code, str(exc.detail)
        )
        return JSONResponse(
            error_body(message, kind),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        rid = getattr(request.state, "request_id", "?")
        logger.exception("internal error in request %s", rid)
        return JSONResponse(
            error_body(f"internal server error (request id {rid})", "internal_server_error"),
            status_code=500,
        )

    # ---------------------------------------------------------------- endpoints

    @app.get("/health")
    async def health():
        if state.draining:
            return JSONResponse(
                error_body("shutting down", "server_error", code="draining"), status_code=503
            )
        if not engine.healthy:
            return JSONResponse(
                error_body(
                    engine.dead_reason or "engine core down", "server_error", code="engine_dead"
                ),
                status_code=503,
            )
        return Response(status_code=200)

    @app.get("/version")
    async def version():
        return {"version": tokenmill.__version__}

    @app.get("/metrics")
    async def metrics_endpoint():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def list_models():
        return {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": int(state.started),
                    "owned_by": "tokenmill",
                    "root": engine.model_name,
                    "max_model_len": engine.max_model_len,
                }
                for name in served_model_names
            ],
        }

    @app.get("/v1/models/{model_id}")
    async def get_model(model_id: str):
        state.check_model(model_id)
        return {
            "id": model_id,
            "object": "model",
            "created": int(state.started),
            "owned_by": "tokenmill",
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = await parse_body(request, ChatCompletionRequest, max_body_bytes)
        return await create_chat_completion(state, req, request, request.state.request_id)

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = await parse_body(request, CompletionRequest, max_body_bytes)
        return await create_completion(state, req, request, request.state.request_id)

    @app.post("/tokenize")
    async def tokenize(request: Request):
        req = await parse_body(request, TokenizeRequest, max_body_bytes)
        state.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise bad_request("exactly one of prompt or messages is required", param="prompt")
        if req.messages is not None:
            chat = ChatCompletionRequest(
                model=state.model_name,
                messages=req.messages,
                add_generation_prompt=req.add_generation_prompt,
            )
            try:
                _, tokens = render_prompt(state, chat)
            except ChatTemplateError as e:
                raise bad_request(str(e), param="messages") from e
        else:
            tokens = engine.tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens)
        return {"count": len(tokens), "max_model_len": engine.max_model_len, "tokens": tokens}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        req = await parse_body(request, DetokenizeRequest, max_body_bytes)
        state.check_model(req.model)
        vocab = engine.tokenizer.vocab_size
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise bad_request(
                f"tokens: id {bad[0]} is outside the vocabulary [0, {vocab})", param="tokens"
            )
        return {"prompt": engine.tokenizer.decode(req.tokens, skip_special_tokens=False)}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache():
        """Admin: forget every cached prefix (all tiers). 409 while requests hold blocks."""
        if not await engine.call_utility("reset_prefix_cache"):
            raise APIError(
                409,
                "prefix cache not reset: requests are running",
                "invalid_request_error",
                None,
                "busy",
            )
        return {"reset": True}

    @app.get("/kv_cache")
    async def kv_cache():
        return await engine.call_utility("kv_stats")

    @app.get("/server_info")
    async def server_info():
        return {
            "model": engine.model_name,
            "max_model_len": engine.max_model_len,
            "engine": engine.engine_info,
            "in_flight": engine.num_in_flight,
            "uptime_s": round(time.time() - state.started, 1),
        }

    return app
