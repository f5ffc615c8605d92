"""The OpenAI-compatible HTTP API (FastAPI). Bodies are parsed by hand (server/body.py) so
that every client mistake — bad JSON, wrong content type, wrong types — gets a 4xx in the
OpenAI envelope; the OpenAPI document still describes every request body."""

from __future__ import annotations

import logging
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

import tokenmill
from tokenmill.engine.async_llm import AsyncLLM
from tokenmill.inputs.validation import first_outside
from tokenmill.server.auth import APIKeyMiddleware
from tokenmill.server.batch.routes import REQUEST_BODIES as BATCH_BODIES
from tokenmill.server.batch.routes import add_batch_routes
from tokenmill.server.body import parse_body, validation_error
from tokenmill.server.effective_config import effective_config
from tokenmill.server.errors import APIError, bad_request, error_body
from tokenmill.server.openapi import add_request_bodies
from tokenmill.server.parse_process import ParseProcess
from tokenmill.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    KVDigestsRequest,
    TokenizeRequest,
)
from tokenmill.server.responses.routes import REQUEST_BODIES as RESPONSES_BODIES
from tokenmill.server.responses.routes import add_response_routes
from tokenmill.server.serving_chat import create_chat_completion, render_prompt
from tokenmill.server.serving_completion import create_completion
from tokenmill.server.state import (
    ClientDisconnected,
    ServerSettings,
    ServerState,
    engine_error,
    off_loop,
)
from tokenmill.server.tokenizer_info import tokenizer_info
from tokenmill.ui.routes import add_ui_routes
from tokenmill.ui.sampler import Sampler
from tokenmill.ui.server_source import ServerSource
from tokenmill.ui.static_files import StaticUI

logger = logging.getLogger(__name__)

REQUEST_BODIES = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/tokenize": TokenizeRequest,
    "/detokenize": DetokenizeRequest,
    **RESPONSES_BODIES,
    **BATCH_BODIES,
}


class RequestIdMiddleware:
    """Pure ASGI (streaming and disconnects pass through untouched): assigns the request id
    and echoes it as X-Request-Id."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        request_id = headers.get(b"x-request-id", b"").decode("latin-1")[:200] or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        rid_header = (b"x-request-id", request_id.encode("latin-1"))

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                existing = [
                    h for h in message.get("headers", []) if h[0].lower() != b"x-request-id"
                ]
                message = {**message, "headers": [*existing, rid_header]}
            await send(message)

        return await self.app(scope, receive, send_with_id)


def build_app(
    engine: AsyncLLM,
    served_model_names: list[str],
    metrics,
    settings: ServerSettings | None = None,
) -> FastAPI:
    settings = settings or ServerSettings()
    state = ServerState(engine, served_model_names, metrics, settings)
    max_body_bytes = settings.max_body_bytes
    sampler = Sampler(ServerSource(metrics.registry))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        gateway = getattr(app.state, "gateway", None)
        if gateway is not None:  # key refresh and config reload run while the app serves
            await gateway.start()
        sampler.start()
        yield
        await sampler.stop()
        if gateway is not None:
            await gateway.stop()
        app.state.parse_process.close()
        state.draining = True
        await engine.shutdown()
        if state._compiler is not None:
            state._compiler.close()

    app = FastAPI(title="tokenmill", version=tokenmill.__version__, lifespan=lifespan)
    app.state.tm = state
    app.state.parse_process = ParseProcess()  # large bodies, parsed away from the loop
    if settings.api_key:
        app.add_middleware(
            APIKeyMiddleware, api_key=settings.api_key, open_paths=settings.open_paths
        )
    if settings.gateway_config:
        from tokenmill.gateway.gateway import Gateway
        from tokenmill.gateway.middleware import GatewayMiddleware

        registry = getattr(metrics, "registry", None)
        gateway = Gateway.from_file(
            settings.gateway_config, registry=registry, max_body_bytes=max_body_bytes
        )
        app.state.gateway = gateway
        app.add_middleware(GatewayMiddleware, gateway=gateway)
    # the pages load without a key, their data needs one
    app.add_middleware(StaticUI, key_required=bool(settings.api_key or settings.gateway_config))
    app.add_middleware(RequestIdMiddleware)

    @app.exception_handler(APIError)
    async def api_error(_request: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def request_validation_error(_request: Request, exc: RequestValidationError):
        return validation_error(exc).response()

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

    async def client_disconnected(request: Request, _exc: Exception):
        # nobody reads it: nginx's "client closed request"
        logger.debug("request %s: the client left", getattr(request.state, "request_id", "?"))
        return Response(status_code=499)

    app.add_exception_handler(ClientDisconnected, client_disconnected)
    app.add_exception_handler(ClientDisconnect, client_disconnected)  # left mid-body

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        rid = getattr(request.state, "request_id", "?")
        logger.exception("internal error in request %s", rid)
        return JSONResponse(
            error_body(f"internal server error (request id {rid})", "internal_server_error"),
            status_code=500,
        )

    # ---------------------------------------------------------------- endpoints

    @app.api_route("/health", methods=["GET", "HEAD"])  # HEAD: load balancers' probes
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
                    **_weights_metadata(engine.engine_info),  # known once the core is ready
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
            "root": engine.model_name,
            "max_model_len": engine.max_model_len,
            **_weights_metadata(engine.engine_info),  # known once the core is ready
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
        _check_prompt_fields(req)
        if req.messages is not None:
            chat = ChatCompletionRequest(
                model=state.model_name,
                messages=req.messages,
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
                tools=req.tools,
                chat_template_kwargs=req.chat_template_kwargs,
            )
            _, tokens = await render_prompt(state, chat)
        else:
            tokens = await off_loop(engine.tokenizer.encode, req.prompt, req.add_special_tokens)
        return {"count": len(tokens), "max_model_len": engine.max_model_len, "tokens": tokens}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        req = await parse_body(request, DetokenizeRequest, max_body_bytes)
        state.check_model(req.model)
        vocab = engine.tokenizer.vocab_size
        bad = first_outside(req.tokens, vocab)
        if bad is not None:
            raise bad_request(
                f"tokens: id {bad} is outside the vocabulary [0, {vocab})", param="tokens"
            )
        text = await off_loop(engine.tokenizer.decode, req.tokens, False)
        return {"prompt": text}

    @app.get("/tokenizer_info")
    async def get_tokenizer_info():
        """vLLM's shape: lets lm-eval and other clients tokenize with the server's tokenizer."""
        return tokenizer_info(engine)

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache():
        """Admin: forget every cached prefix (all tiers). 409 while requests hold blocks."""
        if not await _utility("reset_prefix_cache"):
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
        return await _utility("kv_stats")

    @app.post("/kv_cache/digests")
    async def kv_cache_digests(request: Request):
        """SHA-256 of each full block of a prompt's KV as held here (null: not held)."""
        req = await parse_body(request, KVDigestsRequest, max_body_bytes)
        if len(req.token_ids) > engine.max_model_len:
            raise bad_request("token_ids: longer than max_model_len", param="token_ids")
        return {"digests": await _utility("kv_digests", [req.token_ids, req.cache_salt])}

    async def _utility(method: str, args: list | None = None) -> Any:
        try:
            return await engine.call_utility(method, *(args or []))
        except RuntimeError as e:  # EngineDeadError: 503, not a hang or a 500
            raise engine_error(e, "-") from e

    @app.get("/server_info")
    async def server_info():
        return {
            "model": engine.model_name,
            "max_model_len": engine.max_model_len,
            "engine": engine.engine_info,
            "speculative": engine.engine_info.get("speculative"),
            "in_flight": engine.num_in_flight,
            "max_in_flight": engine.max_in_flight,
            # every setting in force (serve --config FILE included), defaults too
            "config": effective_config(getattr(engine, "config", None), settings),
            "kv_transfer_stats": engine.stats.kv_transfer,
            "uptime_s": round(time.time() - state.started, 1),
            "startup": {
                "api": engine.profile.to_dict() if engine.profile is not None else None,
                "engine_core": engine.engine_info.get("startup"),
            },
        }

    add_response_routes(app, state)
    add_batch_routes(app, state)
    add_ui_routes(
        app,
        sampler,
        lambda: {"kind": "server", "models": served_model_names, "version": tokenmill.__version__},
    )
    add_request_bodies(app, REQUEST_BODIES)
    return app


# /tokenize fields that shape a chat prompt: with `prompt` they would change nothing
_CHAT_ONLY = ("add_generation_prompt", "continue_final_message", "tools", "chat_template_kwargs")


def _check_prompt_fields(req: TokenizeRequest) -> None:
    """A chat-only field set (to other than its default, or empty) with `prompt` is a 400
    naming it."""
    if req.prompt is None:
        return
    for name in _CHAT_ONLY:
        value = getattr(req, name)
        if value != TokenizeRequest.model_fields[name].default and value not in ([], {}):
            raise bad_request(f"{name}: applies to messages, not to a prompt", param=name)


def _weights_metadata(info: dict) -> dict:
    """How the weights run and, when --max-kld measured it, their KLD from float32."""
    meta: dict = {}
    if info.get("weights"):
        meta["weights"] = info["weights"]
    if info.get("quant_plan"):
        meta["quant_plan"] = info["quant_plan"]
    report = info.get("weights_kld")
    if report:
        meta["weights_kld"] = {
            k: report[k]
            for k in ("mean_kld", "p99_kld", "same_top_pct", "rms_dp_pct", "num_tokens")
            if k in report
        }
    return meta
