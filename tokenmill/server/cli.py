"""`tokenmill serve`: the OpenAI-compatible server on the embedded model (or --model)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time
from contextlib import asynccontextmanager

import uvicorn

from tokenmill.engine.arg_utils import build_engine_config, engine_kwargs
from tokenmill.server.auth import API_KEY_ENV, resolve_api_key
from tokenmill.server.responses.config import add_response_store_args, response_store_config
from tokenmill.server.state import DEFAULT_MAX_TOKENS, DEFAULT_OPEN_PATHS, ServerSettings

logger = logging.getLogger("tokenmill.server")


def add_serve_parser(sub, add_engine_args) -> None:
    p = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    p.add_argument("model_path", nargs="?", default=None, help="same as --model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api-key",
        default=None,
        help=f"require 'Authorization: Bearer KEY' (also --api-key-file, or ${API_KEY_ENV}, "
        "which keep the key out of `ps`)",
    )
    p.add_argument("--api-key-file", default=None, metavar="PATH", help="file holding the key")
    p.add_argument(
        "--open-path",
        action="append",
        default=None,
        metavar="PATH",
        help="with a key: a path served without it (repeatable; default: "
        f"{' '.join(DEFAULT_OPEN_PATHS)}; give --open-path /health alone to protect /metrics)",
    )
    p.add_argument("--served-model-name", action="append", default=None, help="name(s) clients use")
    p.add_argument(
        "--max-queue-len", type=int, default=256, help="sequences allowed to wait; beyond: 503"
    )
    p.add_argument("--max-request-body", type=int, default=4 * 1024 * 1024, metavar="BYTES")
    p.add_argument(
        "--default-max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help="max tokens of a chat completion that gives none (capped by the context)",
    )
    p.add_argument(
        "--allow-special-tokens-in-content",
        action="store_true",
        help="trusted callers only: let requests set special_tokens_in_content (control-token "
        "strings in messages become control tokens)",
    )
    p.add_argument(
        "--drain-timeout", type=float, default=30.0, help="seconds to finish requests on SIGTERM"
    )
    add_response_store_args(p)
    add_engine_args(p)
    p.set_defaults(func=cmd_serve)


def server_settings(args: argparse.Namespace) -> ServerSettings:
    if args.default_max_tokens < 1:
        raise ValueError("default-max-tokens: must be >= 1")
    return ServerSettings(
        api_key=resolve_api_key(args.api_key, args.api_key_file),
        open_paths=tuple(args.open_path) if args.open_path else DEFAULT_OPEN_PATHS,
        max_body_bytes=args.max_request_body,
        default_max_tokens=args.default_max_tokens,
        allow_special_tokens_in_content=args.allow_special_tokens_in_content,
        response_store=response_store_config(args),
    )


def cmd_serve(args: argparse.Namespace) -> int:
    from fastapi import FastAPI

    from tokenmill.engine.async_llm import AsyncLLM
    from tokenmill.server.api import build_app
    from tokenmill.server.metrics import ServerMetrics

    model = args.model_path or args.model
    config = build_engine_config(model, **engine_kwargs(args))
    settings = server_settings(args)
    uvicorn_level = "info" if logging.getLogger().level <= logging.INFO else "warning"
    holder: dict[str, FastAPI] = {}
    holder_error: list[str] = []

    @asynccontextmanager
    async def lifespan(_outer: FastAPI):
        engine = AsyncLLM(config, max_queue_len=args.max_queue_len, log_level="INFO")
        metrics = ServerMetrics(
            args.served_model_name[0] if args.served_model_name else engine.model_name
        )
        engine.observer = metrics
        try:
            await engine.start()
        except Exception as e:
            holder_error.append(str(e))
            raise
        metrics.set_weights_kld(engine.engine_info.get("weights_kld"))
        names = args.served_model_name or [engine.model_name]
        app = build_app(engine, names, metrics, settings)
        holder["app"] = app
        logger.warning(
            "tokenmill serving %s on http://%s:%d (max_model_len %d)",
            names[0], args.host, args.port, engine.max_model_len,
        )  # fmt: skip
        async with app.router.lifespan_context(app):
            yield

    outer = FastAPI(lifespan=lifespan)

    async def dispatch(scope, receive, send):
        if scope["type"] == "lifespan":
            return await outer(scope, receive, send)
        return await holder["app"](scope, receive, send)

    uv_config = uvicorn.Config(
        dispatch,
        host=args.host,
        port=args.port,
        log_level=uvicorn_level,
        timeout_graceful_shutdown=args.drain_timeout,
        access_log=False,
    )
    logging.getLogger("tokenmill.access").setLevel(logging.INFO)
    server = DrainingServer(uv_config, holder, args.drain_timeout)
    # uvicorn re-raises a handled SIGTERM to the previous handler after shutting down; a
    # drained shutdown is a clean exit (status 0), so that handler does nothing.
    signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        asyncio.run(server.serve())
    except SystemExit:  # uvicorn exits with its own status when start-up fails
        if "app" in holder:
            raise
    if "app" not in holder:  # the engine never started: say why, as other CLI errors do
        print(f"error: {holder_error[0] if holder_error else 'start-up failed'}", file=sys.stderr)
        return 2
    return 0


class DrainingServer(uvicorn.Server):
    """SIGTERM drains before uvicorn stops listening: /health answers 503 and new generation
    requests 503 (server_shutting_down) while in-flight requests finish, up to the drain
    timeout; then uvicorn shuts down. A second signal stops at once."""

    def __init__(self, config, holder: dict, drain_timeout: float) -> None:
        super().__init__(config)
        self.holder = holder
        self.drain_timeout = drain_timeout
        self.drain_started: float | None = None

    def handle_exit(self, sig, frame) -> None:
        app = self.holder.get("app")
        if self.drain_started is not None or app is None:
            return super().handle_exit(sig, frame)
        self.drain_started = time.monotonic()
        app.state.tm.draining = True
        logger.warning("draining: %d sequences in flight", app.state.tm.engine.num_in_flight)

    async def on_tick(self, counter: int) -> bool:
        if self.drain_started is not None and not self.should_exit:
            engine = self.holder["app"].state.tm.engine
            waited = time.monotonic() - self.drain_started
            if engine.num_in_flight == 0 or waited >= self.drain_timeout:
                self.should_exit = True
        return await super().on_tick(counter)
