"""The OpenAI-compatible HTTP API (FastAPI): build_app creates the app, puts the server's
state in app.state, adds the middleware and error handlers and includes the routers
(server/routes/, the Responses API, files and batches, the UI's data). Bodies are parsed by
hand (server/body.py) so that every client mistake — bad JSON, wrong content type, wrong
types — gets a 4xx in the OpenAI envelope; the OpenAPI document still describes every
request body."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI

from tokenmill.engine.async_llm import AsyncLLM
from tokenmill.server.auth import APIKeyMiddleware
from tokenmill.server.batch import file_routes as batch_files
from tokenmill.server.batch import routes as batches
from tokenmill.server.batch import service as batch_service
from tokenmill.server.error_handlers import add_exception_handlers
from tokenmill.server.openapi import add_request_bodies
from tokenmill.server.parse_process import ParseProcess
from tokenmill.server.request_id import RequestIdMiddleware
from tokenmill.server.responses import routes as responses
from tokenmill.server.routes import admin, embeddings, health, lora, openai, tokenize
from tokenmill.server.settings import ServerSettings
from tokenmill.server.state import ServerState
from tokenmill.ui.routes import add_ui_routes
from tokenmill.ui.sampler import Sampler
from tokenmill.ui.server_source import ServerSource
from tokenmill.ui.static_files import StaticUI
from tokenmill.version import __version__

__all__ = ["RequestIdMiddleware", "build_app"]


def build_app(
    engine: AsyncLLM,
    served_model_names: list[str],
    metrics,
    settings: ServerSettings | None = None,
) -> FastAPI:
    settings = settings or ServerSettings()
    state = ServerState(engine, served_model_names, metrics, settings)
    app = FastAPI(title="tokenmill", version=__version__, lifespan=lifespan)
    app.state.tm = state
    app.state.parse_process = ParseProcess()  # large bodies, parsed away from the loop
    app.state.sampler = Sampler(ServerSource(metrics.registry))
    app.state.responses = responses.open_service(state)
    app.state.batch = batch_service.open_service(state)  # None: batches are off
    _add_middleware(app, settings, metrics)
    add_exception_handlers(app)
    bodies = {**openai.REQUEST_BODIES, **tokenize.REQUEST_BODIES, **responses.REQUEST_BODIES}
    bodies.update(embeddings.REQUEST_BODIES)
    bodies.update(lora.REQUEST_BODIES)
    for router in (health.router, openai.router, embeddings.router, tokenize.router, admin.router):
        app.include_router(router)
    app.include_router(lora.router)
    app.include_router(responses.router)
    if app.state.batch is not None:
        app.include_router(batch_files.router)
        app.include_router(batches.router)
        bodies.update(batches.REQUEST_BODIES)
    add_ui_routes(
        app,
        app.state.sampler,
        lambda: {"kind": "server", "models": served_model_names, "version": __version__},
    )
    add_request_bodies(app, bodies)
    return app


def _add_middleware(app: FastAPI, settings: ServerSettings, metrics) -> None:
    """Outermost last: request id, the UI's pages, the gateway or the API key."""
    if settings.api_key:
        app.add_middleware(
            APIKeyMiddleware, api_key=settings.api_key, open_paths=settings.open_paths
        )
    if settings.gateway_config:
        from tokenmill.gateway.gateway import Gateway
        from tokenmill.gateway.middleware import GatewayMiddleware

        registry = getattr(metrics, "registry", None)
        gateway = Gateway.from_file(
            settings.gateway_config, registry=registry, max_body_bytes=settings.max_body_bytes
        )
        app.state.gateway = gateway
        gateway.root_app = app
        app.add_middleware(GatewayMiddleware, gateway=gateway)
    # the pages load without a key, their data needs one
    app.add_middleware(StaticUI, key_required=bool(settings.api_key or settings.gateway_config))
    app.add_middleware(RequestIdMiddleware)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """The engine and helpers around everything; then responses and batches, which stop
    first (their work runs on the engine)."""
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(_serving(app))
        await stack.enter_async_context(responses.lifespan(app.state.responses))
        if app.state.batch is not None:
            app.state.batch.runner.gateway = getattr(app.state, "gateway", None)
            await stack.enter_async_context(batch_service.lifespan(app.state.batch))
        yield


@asynccontextmanager
async def _serving(app: FastAPI) -> AsyncIterator[None]:
    state: ServerState = app.state.tm
    gateway = getattr(app.state, "gateway", None)
    if gateway is not None:  # key refresh and config reload run while the app serves
        await gateway.start()
    app.state.sampler.start()
    yield
    await app.state.sampler.stop()
    if gateway is not None:
        await gateway.stop()
    app.state.parse_process.close()
    state.draining = True
    await state.engine.shutdown()
    if state._compiler is not None:
        state._compiler.close()
