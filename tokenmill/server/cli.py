"""`tokenmill serve`: the OpenAI-compatible server on the embedded model (or --model)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from contextlib import asynccontextmanager

from tokenmill.engine.arg_utils import build_engine_config

logger = logging.getLogger("tokenmill.server")


def add_serve_parser(sub, add_engine_args) -> None:
    p = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    p.add_argument("model_path", nargs="?", default=None, help="same as --model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 endpoints"
    )
    p.add_argument("--served-model-name", action="append", default=None, help="name(s) clients use")
    p.add_argument(
        "--max-queue-len", type=int, default=256, help="sequences allowed to wait; beyond: 503"
    )
    p.add_argument("--max-request-body", type=int, default=4 * 1024 * 1024, metavar="BYTES")
    p.add_argument(
        "--drain-timeout", type=float, default=30.0, help="seconds to finish requests on SIGTERM"
    )
    add_engine_args(p)
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn
    from fastapi import FastAPI

    from tokenmill.engine.arg_utils import engine_kwargs
    from tokenmill.engine.async_llm import AsyncLLM
    from tokenmill.server.api import build_app
    from tokenmill.server.metrics import ServerMetrics

    model = args.model_path or args.model
    config = build_engine_config(model, **engine_kwargs(args))
    uvicorn_level = "info" if logging.getLogger().level <= logging.INFO else "warning"
    holder: dict[str, FastAPI] = {}

    @asynccontextmanager
    async def lifespan(_outer: FastAPI):
        engine = AsyncLLM(config, max_queue_len=args.max_queue_len, log_level="INFO")
        metrics = ServerMetrics(
            args.served_model_name[0] if args.served_model_name else engine.model_name
        )
        engine.observer = metrics
        await engine.start()
        names = args.served_model_name or [engine.model_name]
        app = build_app(engine, names, metrics, args.api_key, args.max_request_body)
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
    server = uvicorn.Server(uv_config)
    # uvicorn drains on SIGTERM, then re-raises it to the previous handler; a drained
    # shutdown is a clean exit (status 0), so that handler does nothing.
    signal.signal(signal.SIGTERM, lambda *_: None)
    asyncio.run(server.serve())
    return 0
