"""The router's HTTP front: the OpenAI API of the replicas behind it, plus /router_info.
build_router_app creates the app, puts the Router and its RouterFront (router/front.py) in
app.state, adds the middleware and includes the routers (router/routes/)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import httpx
from fastapi import APIRouter, FastAPI

from tokenmill.router.auth import APIKeyMiddleware, open_paths
from tokenmill.router.client_requests import (
    parse_json,
    read_body,
    unless_client_leaves,
    until_disconnect,
)
from tokenmill.router.front import Cluster, RouterFront
from tokenmill.router.prompts import PromptHasher
from tokenmill.router.router import Router
from tokenmill.router.routes import admin, generation, health, passthrough
from tokenmill.router.ui_source import RouterSource
from tokenmill.server.error_handlers import add_exception_handlers
from tokenmill.ui.routes import add_ui_routes
from tokenmill.ui.sampler import Sampler
from tokenmill.ui.static_files import StaticUI
from tokenmill.version import __version__

# the client-side helpers, where they were first defined
__all__ = [
    "build_router_app",
    "parse_json",
    "read_body",
    "unless_client_leaves",
    "until_disconnect",
]


def build_router_app(
    router: Router,
    hasher: PromptHasher,
    transport: httpx.AsyncBaseTransport | None = None,
    api_key: str | None = None,
    protect_metrics: bool = False,
    gateway_config: str | None = None,
    cluster: Cluster | None = None,
    extra_routes: Sequence[APIRouter] = (),
    replica_key: str | None = None,
) -> FastAPI:
    """`transport` replaces the network to the replicas (tests). With `api_key`, clients
    need it. The router presents `replica_key` to the replicas (default: `api_key`, one key
    for the cluster) on every request, health checks included. With `gateway_config`,
    clients present gateway keys instead. With `cluster`, the router follows its workers as
    they join, restart and leave, and serves `/cluster` and `/cluster/scale`."""
    replica_key = replica_key if replica_key is not None else api_key
    front = RouterFront(router, hasher, transport, replica_key, cluster)
    app = FastAPI(title="tokenmill router", version=__version__, lifespan=lifespan)
    app.state.router = router
    app.state.front = front
    app.state.sampler = Sampler(RouterSource(router, lambda: front.admission.waiting))
    _add_middleware(app, router, api_key, protect_metrics, gateway_config)
    if cluster is not None:
        app.state.cluster = cluster
    for routes in extra_routes:  # a cluster's /cluster and /cluster/scale
        app.include_router(routes)
    add_exception_handlers(app)  # every failure in the OpenAI envelope, as the server's
    for routes in (generation, passthrough, health, admin):
        app.include_router(routes.router)
    add_ui_routes(
        app,
        app.state.sampler,
        lambda: {
            "kind": "router",
            "policy": router.config.policy,
            "version": __version__,
        },
        lambda: {**router.snapshot(), "decisions": router.recent_decisions()},
    )
    return app


def _add_middleware(
    app: FastAPI,
    router: Router,
    api_key: str | None,
    protect_metrics: bool,
    gateway_config: str | None,
) -> None:
    if gateway_config is not None:
        from tokenmill.gateway.gateway import Gateway
        from tokenmill.gateway.middleware import GatewayMiddleware

        gateway = Gateway.from_file(
            gateway_config,
            registry=router.metrics.registry,
            max_body_bytes=router.config.max_body_bytes,
        )
        app.state.gateway = gateway
        gateway.root_app = app
        app.add_middleware(GatewayMiddleware, gateway=gateway)
    elif api_key is not None:
        app.add_middleware(
            APIKeyMiddleware, api_key=api_key, open_paths=open_paths(protect_metrics)
        )
    # the pages load without a key, their data needs one
    app.add_middleware(StaticUI, key_required=gateway_config is not None or api_key is not None)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    front: RouterFront = app.state.front
    sampler: Sampler = app.state.sampler
    async with front.running():
        gateway = getattr(app.state, "gateway", None)
        if gateway is not None:  # key refresh and config reload run while the app serves
            await gateway.start()
        sampler.start()
        try:
            yield
        finally:
            await sampler.stop()
            if gateway is not None:
                await gateway.stop()
