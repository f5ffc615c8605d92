"""`tokenmill serve`: the OpenAI-compatible server on the embedded model (or --model)."""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
import threading
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from tokenmill.engine.arg_utils import EngineArgs, add_kv_transfer_args
from tokenmill.engine.startup import StartupProfile
from tokenmill.platform import run_at_low_priority
from tokenmill.ports import parse_port
from tokenmill.server.batch.config import add_batch_args, batch_config
from tokenmill.server.responses.config import add_response_store_args, response_store_config
from tokenmill.server.settings import (
    API_KEY_ENV,
    DEFAULT_MAX_TOKENS,
    DEFAULT_OPEN_PATHS,
    ServerSettings,
    resolve_api_key,
)
from tokenmill.structured.call_lists import TOOL_CALL_PARSER_CHOICES
from tokenmill.structured.reasoning import REASONING_PARSER_CHOICES

if TYPE_CHECKING:
    from tokenmill.model.model_files import ModelFiles

logger = logging.getLogger("tokenmill.server")


def add_serve_parser(sub, add_engine_args) -> None:
    p = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    p.add_argument("model_path", nargs="?", default=None, help="same as --model")
    p.add_argument(
        "--log-level",
        default=argparse.SUPPRESS,
        help="as `tokenmill --log-level`; debug also logs the start-up profile",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=parse_port, default=8000)
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
    p.add_argument(
        "--gateway-config",
        default=None,
        metavar="FILE",
        help="turn on the gateway from this YAML file: API keys, limits and budgets, the "
        "usage ledger, guardrails, tool-call policy (docs/gateway.md; replaces --api-key)",
    )
    p.add_argument("--served-model-name", action="append", default=None, help="name(s) clients use")
    p.add_argument(
        "--max-queue-len", type=int, default=256, help="sequences allowed to wait; beyond: 503"
    )
    p.add_argument(
        "--max-request-body", type=int, default=ServerSettings.max_body_bytes, metavar="BYTES"
    )
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
        "--reasoning-parser",
        default="auto",
        choices=REASONING_PARSER_CHOICES,
        help="split <think> reasoning from the answer into reasoning_content (auto: when the "
        "model's chat template uses <think>; none: leave it in the content)",
    )
    p.add_argument(
        "--tool-call-parser",
        default="auto",
        choices=TOOL_CALL_PARSER_CHOICES,
        help="the format tool calls are read in (auto: from the chat template; hermes: "
        "<tool_call> JSON; pythonic: [f(a=1)] as Gemma 3 / Llama 3.2; phi4_mini_json: "
        "functools[...] as Phi-4-mini)",
    )
    p.add_argument(
        "--drain-timeout", type=float, default=30.0, help="seconds to finish requests on SIGTERM"
    )
    add_response_store_args(p)
    add_batch_args(p)
    add_engine_args(p)
    add_kv_transfer_args(p)
    # batch lines run below interactive requests: the priority policy admits those first and
    # preempts batch lines first (with equal priorities it is first-come-first-served)
    p.set_defaults(scheduling_policy="priority")
    p.set_defaults(func=cmd_serve)


def server_settings(args: argparse.Namespace) -> ServerSettings:
    if args.default_max_tokens < 1:
        raise ValueError("default-max-tokens: must be >= 1")
    api_key = resolve_api_key(args.api_key, args.api_key_file)
    if args.gateway_config is not None:
        from tokenmill.gateway.config import load_gateway_config

        if api_key is not None:
            raise ValueError("gateway-config: the gateway's keys replace --api-key; give one")
        load_gateway_config(args.gateway_config)  # a bad file fails here, before the model loads
    return ServerSettings(
        api_key=api_key,
        gateway_config=args.gateway_config,
        open_paths=tuple(args.open_path) if args.open_path else DEFAULT_OPEN_PATHS,
        max_body_bytes=args.max_request_body,
        default_max_tokens=args.default_max_tokens,
        allow_special_tokens_in_content=args.allow_special_tokens_in_content,
        reasoning_parser=args.reasoning_parser,
        tool_call_parser=args.tool_call_parser,
        response_store=response_store_config(args),
        batch=batch_config(args),
    )


def cmd_serve(args: argparse.Namespace) -> int:
    profile = getattr(args, "startup_profile", None) or StartupProfile("api")
    model = args.model_path or args.model
    config = EngineArgs.from_cli_args(args, model=model).create_engine_config()
    settings = server_settings(args)
    profile.mark("arguments")
    # The engine core loads the model while this process imports the server and reads the
    # tokenizer: the two start in parallel.
    from tokenmill.engine.core_client import EngineCoreClient

    debug = logging.getLogger().level <= logging.DEBUG
    single_threaded = threading.active_count() == 1 and sys.platform.startswith("linux")
    client = EngineCoreClient(
        config,
        log_level="DEBUG" if debug else "INFO",
        start_method="fork" if single_threaded else "spawn",
        early=getattr(args, "early_engine_core", None),
    )
    profile.mark("start the engine core")
    serving = False
    try:
        files = _prepare_front_end(config, profile)
        serving = _serve(args, config, settings, client, profile, files)
    finally:
        if not serving:
            client.shutdown()
    return 0 if serving else 2


# what _serve imports: imported by _prepare_front_end, at a lower priority
_SERVER_MODULES = (
    "uvicorn",
    "fastapi",
    "tokenmill.engine.async_llm",
    "tokenmill.server.api",
    "tokenmill.server.draining",
    "tokenmill.server.metrics",
)


def _prepare_front_end(config, profile: StartupProfile) -> ModelFiles | None:
    """Imports the server and reads the tokenizer and chat template on a thread at a lower
    priority while this one waits: the engine core starting beside this process is the
    critical path, and on a 2-core machine its import of torch should keep a core. None
    when the model's files cannot be read here (the engine core then says why)."""

    def prepare() -> ModelFiles | None:
        for module in _SERVER_MODULES:
            importlib.import_module(module)
        profile.mark("imports")
        from tokenmill.engine.async_llm import warm_up_front_end
        from tokenmill.model.model_files import read_model_info

        try:
            files = read_model_info(config.model_config.model)
        except Exception:  # read again by the engine, whose error the server reports
            logger.debug("reading the model's files", exc_info=True)
            return None
        warm_up_front_end(files.tokenizer, files.chat_template)
        profile.mark("tokenizer and chat template")
        return files

    return run_at_low_priority(prepare)


async def _unavailable(scope, receive, send) -> None:
    """503 in the OpenAI envelope for a request that reaches a server whose start failed."""
    if scope["type"] != "http":
        return
    body = b'{"error":{"message":"the server failed to start","type":"unavailable","code":503}}'
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _serve(args, config, settings, client, profile: StartupProfile, files=None) -> bool:
    """Runs the server until it stops; False when it never started (the reason printed).
    `files`: the model's tokenizer and chat template, read already."""
    import asyncio

    import uvicorn
    from fastapi import FastAPI

    from tokenmill.engine.async_llm import AsyncLLM
    from tokenmill.server.api import build_app
    from tokenmill.server.draining import DrainingServer
    from tokenmill.server.http_protocol import envelope_protocol
    from tokenmill.server.lora import check_lora_names
    from tokenmill.server.metrics import ServerMetrics

    uvicorn_level = "info" if logging.getLogger().level <= logging.INFO else "warning"
    holder: dict[str, FastAPI] = {}
    holder_error: list[str] = []

    @asynccontextmanager
    async def lifespan(_outer: FastAPI):
        engine = AsyncLLM(
            config,
            max_queue_len=args.max_queue_len,
            client=client,
            profile=profile,
            model_files=files,
        )
        metrics = ServerMetrics(
            args.served_model_name[0] if args.served_model_name else engine.model_name
        )
        engine.observer = metrics
        names = args.served_model_name or [engine.model_name]
        try:
            check_lora_names(config.lora_modules, names)
            # built while the engine core loads (its routes read the engine's facts when
            # called); not at a low priority: the gateway's ledger writer starts here and
            # would inherit it
            app = build_app(engine, names, metrics, settings)
            profile.mark("build the app")
            await engine.start()
        except Exception as e:  # said once, below, as other CLI errors are: no traceback
            holder_error.append(str(e))
            server.should_exit = True
            await engine.shutdown()
            yield
            return
        metrics.set_weights_kld(engine.engine_info.get("weights_kld"))
        holder["app"] = app
        logger.warning(
            "tokenmill serving %s on http://%s:%d (max_model_len %d, ready %.1f s after launch)",
            names[0], args.host, args.port, engine.max_model_len, profile.total,
        )  # fmt: skip
        async with app.router.lifespan_context(app):
            yield

    outer = FastAPI(lifespan=lifespan)

    async def dispatch(scope, receive, send):
        if scope["type"] == "lifespan":
            return await outer(scope, receive, send)
        if "app" not in holder:  # start-up failed: the server is on its way out
            return await _unavailable(scope, receive, send)
        return await holder["app"](scope, receive, send)

    uv_config = uvicorn.Config(
        dispatch,
        host=args.host,
        port=args.port,
        log_level=uvicorn_level,
        timeout_graceful_shutdown=args.drain_timeout,
        access_log=False,
        http=envelope_protocol(),  # uvicorn's own 400s in the OpenAI error envelope too
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
        return False
    return True
