"""The router's HTTP front: the OpenAI API of the replicas behind it, plus /router_info."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

import tokenmill
from tokenmill.router.admission import Admission
from tokenmill.router.auth import APIKeyMiddleware, open_paths
from tokenmill.router.health import check_replica, health_loop
from tokenmill.router.prompts import PromptHasher, RequestKey
from tokenmill.router.proxy import Proxy, UpstreamStream, return_headers, upstream_headers
from tokenmill.router.router import Router
from tokenmill.router.workers import CPUWorkers
from tokenmill.server.errors import APIError, error_body
from tokenmill.ui.router_source import RouterSource
from tokenmill.ui.routes import add_ui_routes
from tokenmill.ui.sampler import Sampler
from tokenmill.ui.static_files import StaticUI

if TYPE_CHECKING:
    from tokenmill.cluster.manager import ClusterManager

logger = logging.getLogger("tokenmill.router")


async def read_body(request: Request, max_bytes: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise APIError(413, f"request body of {length} bytes exceeds the limit of {max_bytes}")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > max_bytes:
            raise APIError(413, f"request body exceeds the limit of {max_bytes} bytes")
    return bytes(body)


async def until_disconnect(request: Request) -> None:
    """Returns when the client goes away (call once its body has been read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_client_leaves(request: Request, work: Awaitable[Response]) -> Response | None:
    """`work`'s reply, or None if the client left first. Then `work` is cancelled: that
    closes its request to the replica, which aborts the generation and frees its blocks,
    and releases the router's booking (a started stream watches for itself)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(until_disconnect(request))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # cancelled: a reply that is ready will never be sent
        if task.done() and not task.cancelled() and task.exception() is None:
            reply = task.result()
            if isinstance(reply, UpstreamStream):
                await reply.cleanup()
        raise
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        return task.result()
    await asyncio.gather(task, return_exceptions=True)  # its cleanup, before the slot goes
    return None


def parse_json(body: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def build_router_app(
    router: Router,
    hasher: PromptHasher,
    transport: httpx.AsyncBaseTransport | None = None,
    api_key: str | None = None,
    protect_metrics: bool = False,
    gateway_config: str | None = None,
    cluster: ClusterManager | None = None,
    replica_key: str | None = None,
) -> FastAPI:
    """`transport` replaces the network to the replicas (tests). With `api_key`, clients
    need it. The router presents `replica_key` to the replicas (default: `api_key`, one key
    for the cluster) on every request, health checks included. With `gateway_config`,
    clients present gateway keys instead. With `cluster`, the router follows its workers as
    they join, restart and leave, and serves `/cluster` and `/cluster/scale`."""
    replica_key = replica_key if replica_key is not None else api_key
    config = router.config
    admission = Admission(config.max_in_flight, config.max_queue, config.queue_timeout_s)
    holder: dict[str, Any] = {}
    turn = [0]  # passthrough rotation
    sampler = Sampler(RouterSource(router, lambda: admission.waiting))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # keep-alive shorter than the replicas' (uvicorn: 5 s), so a reused connection is
        # never one the replica is closing
        limits = httpx.Limits(
            max_connections=config.max_in_flight + 64,
            max_keepalive_connections=64,
            keepalive_expiry=2.0,
        )
        timeout = httpx.Timeout(
            connect=config.connect_timeout_s, read=config.read_timeout_s, write=30.0, pool=None
        )
        auth = {"authorization": f"Bearer {replica_key}"} if replica_key is not None else None
        client = httpx.AsyncClient(
            limits=limits, timeout=timeout, transport=transport, headers=auth
        )
        holder["client"] = client
        holder["workers"] = CPUWorkers(config.prompt_threads)
        checks: dict[str, asyncio.Task] = {}

        def suspect(name: str) -> None:
            """At most one check per replica at a time: a burst of failed requests on one
            replica asks once, not once each."""
            if name in checks or name not in router.replicas:
                return
            task = asyncio.get_running_loop().create_task(
                check_replica(router, client, router.replicas[name], timeout_s=2.0)
            )
            checks[name] = task
            task.add_done_callback(lambda _: checks.pop(name, None))

        holder["proxy"] = Proxy(router, client, suspect, replica_key)
        router.start_events()
        task = asyncio.create_task(health_loop(router, client))
        tasks = [task]
        if cluster is not None:
            cluster.attach(router)
            tasks.append(asyncio.create_task(cluster.run()))
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
            pending = [*tasks, *checks.values()]
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            router.stop_events()
            holder["workers"].close()
            await client.aclose()

    app = FastAPI(title="tokenmill router", version=tokenmill.__version__, lifespan=lifespan)
    app.state.router = router
    if gateway_config is not None:
        from tokenmill.gateway.gateway import Gateway
        from tokenmill.gateway.middleware import GatewayMiddleware

        gateway = Gateway.from_file(
            gateway_config, registry=router.metrics.registry, max_body_bytes=config.max_body_bytes
        )
        app.state.gateway = gateway
        app.add_middleware(GatewayMiddleware, gateway=gateway)
    elif api_key is not None:
        app.add_middleware(
            APIKeyMiddleware, api_key=api_key, open_paths=open_paths(protect_metrics)
        )
    # the pages load without a key, their data needs one
    app.add_middleware(
        StaticUI, key_required=gateway_config is not None or api_key is not None
    )

    if cluster is not None:
        from tokenmill.cluster.routes import add_cluster_routes

        add_cluster_routes(app, cluster)

    @app.exception_handler(APIError)
    async def api_error(_request: Request, exc: APIError):
        return exc.response()

    def request_key(endpoint: str, data: dict[str, Any], session: str | None) -> RequestKey | None:
        """Renders, tokenizes and hashes the prompt (CPU work: run off the event loop).
        Without a key the request is still routed, by load."""
        try:
            key = hasher.key(endpoint, data, session)
        except ValueError:
            return None  # invalid: a replica answers with the precise 4xx
        except Exception:
            logger.exception("no routing key for a %s request", endpoint)
            return None
        for block_size in {r.block_size for r in router.replicas.values()}:
            key.hashes(block_size)  # cached on the key for the decision
        return key

    async def routed(request: Request, path: str, endpoint: str) -> Response:
        request_id = request.headers.get("x-request-id", "")[:200] or uuid.uuid4().hex
        body = await read_body(request, config.max_body_bytes)
        data = parse_json(body)
        if data is not None and "kv_transfer_params" in data:
            del data["kv_transfer_params"]  # the router's to set, never a client's
            body = json.dumps(data).encode()
        stream = bool(data.get("stream")) if data else False
        try:
            ticket = await admission.acquire()  # also bounds the prompts waiting to be hashed
        except APIError:
            router.metrics.rejected.labels("queue_full").inc()
            raise
        try:
            key = None
            if data is not None:
                session = request.headers.get("x-session-id")
                workers: CPUWorkers = holder["workers"]
                key = await workers.run(lambda: request_key(endpoint, data, session))
            reply = await unless_client_leaves(
                request,
                holder["proxy"].forward(
                    path, body, dict(request.headers), key, stream, request_id, ticket, data
                ),
            )
        finally:
            ticket.release()  # a no-op once a stream took it over
        if reply is None:
            logger.info("request %s: the client left; cancelled at the replica", request_id)
            router.metrics.client_gone.inc()
            return Response(status_code=499)  # nobody reads it
        return reply

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await routed(request, "/v1/chat/completions", "chat")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await routed(request, "/v1/completions", "completions")

    async def passthrough(request: Request, path: str) -> Response:
        """Any healthy replica answers (models, tokenize, version)."""
        client: httpx.AsyncClient = holder["client"]
        body = await read_body(request, config.max_body_bytes)
        headers = upstream_headers(
            dict(request.headers), ("content-type", "authorization", "x-request-id"),
            api_key=replica_key,
        )  # fmt: skip
        healthy = router.healthy()
        turn[0] += 1
        for i in range(len(healthy)):
            r = healthy[(turn[0] + i) % len(healthy)]
            try:
                resp = await client.request(
                    request.method, r.url + path, content=body or None, headers=headers,
                    params=request.query_params, timeout=30.0,
                )  # fmt: skip
            except httpx.HTTPError:
                continue
            if resp.status_code in (502, 503, 504) and i + 1 < len(healthy):
                continue
            rid = request.headers.get("x-request-id", "")
            return Response(resp.content, resp.status_code, return_headers(resp, rid))
        return APIError(
            503, "no healthy replica", "server_error", None, "no_healthy_replica"
        ).response()

    @app.get("/v1/models")
    async def models(request: Request):
        return await passthrough(request, "/v1/models")

    @app.get("/v1/models/{model_id}")
    async def model(request: Request, model_id: str):
        return await passthrough(request, f"/v1/models/{model_id}")

    @app.post("/tokenize")
    async def tokenize(request: Request):
        return await passthrough(request, "/tokenize")

    @app.post("/detokenize")
    async def detokenize(request: Request):
        return await passthrough(request, "/detokenize")

    @app.get("/version")
    async def version():
        return {"version": tokenmill.__version__, "role": "router"}

    @app.get("/health")
    async def health():
        if router.healthy():
            return Response(status_code=200)
        return JSONResponse(
            error_body("no healthy replica", "server_error", code="no_healthy_replica"),
            status_code=503,
        )

    @app.get("/metrics")
    async def metrics():
        router.metrics.queued.set(admission.waiting)
        return Response(
            router.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    @app.get("/router_info")
    async def router_info():
        return {
            **router.snapshot(),
            "in_flight": admission.in_flight,
            "queued": admission.waiting,
        }

    add_ui_routes(
        app,
        sampler,
        lambda: {"kind": "router", "policy": config.policy, "version": tokenmill.__version__},
        lambda: {**router.snapshot(), "decisions": router.recent_decisions()},
    )

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request):
        """Admin: resets every healthy replica's prefix cache (benchmarks start cold)."""
        client: httpx.AsyncClient = holder["client"]
        headers = upstream_headers(dict(request.headers), ("authorization",), api_key=replica_key)
        out = {}
        for r in router.healthy():
            try:
                resp = await client.post(r.url + "/reset_prefix_cache", headers=headers)
                out[r.name] = resp.status_code
            except httpx.HTTPError as e:
                out[r.name] = type(e).__name__
        ok = all(v == 200 for v in out.values())
        return JSONResponse({"reset": ok, "replicas": out}, status_code=200 if ok else 409)

    return app
