"""The router's HTTP front, shared by its routes (app.state.front): admission, the routing
key of a prompt, forwarding to the chosen replica (or any healthy one), and the connection
pool, CPU workers and health checks that run while the app serves."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from tokenmill.router.admission import Admission
from tokenmill.router.client_requests import parse_json, read_body, unless_client_leaves
from tokenmill.router.health import check_replica, health_loop
from tokenmill.router.prompts import PromptHasher, RequestKey, served_adapters
from tokenmill.router.proxy import Proxy, return_headers, upstream_headers
from tokenmill.router.router import Router
from tokenmill.router.workers import CPUWorkers
from tokenmill.server.errors import APIError

logger = logging.getLogger("tokenmill.router")


class Cluster(Protocol):
    """What the front needs of a ClusterManager (cluster/manager.py)."""

    def attach(self, router: Router) -> None: ...

    async def run(self) -> None: ...


class RouterFront:
    def __init__(
        self,
        router: Router,
        hasher: PromptHasher,
        transport: httpx.AsyncBaseTransport | None,
        replica_key: str | None,
        cluster: Cluster | None,
    ) -> None:
        self.router = router
        self.config = router.config
        self.hasher = hasher
        self.transport = transport
        self.replica_key = replica_key
        self.cluster = cluster
        config = self.config
        self.admission = Admission(config.max_in_flight, config.max_queue, config.queue_timeout_s)
        self.turn = 0  # passthrough rotation
        # while the app serves (running())
        self.client: httpx.AsyncClient | None = None
        self.workers: CPUWorkers | None = None
        self.proxy: Proxy | None = None
        self.checks: dict[str, asyncio.Task] = {}

    # ------------------------------------------------------------ lifetime

    def _client(self) -> httpx.AsyncClient:
        config = self.config
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
        key = self.replica_key
        auth = {"authorization": f"Bearer {key}"} if key is not None else None
        return httpx.AsyncClient(
            limits=limits, timeout=timeout, transport=self.transport, headers=auth
        )

    def _suspect(self, name: str) -> None:
        """At most one check per replica at a time: a burst of failed requests on one
        replica asks once, not once each."""
        router = self.router
        if name in self.checks or name not in router.replicas:
            return
        task = asyncio.get_running_loop().create_task(
            check_replica(router, self.client, router.replicas[name], timeout_s=2.0)
        )
        self.checks[name] = task
        task.add_done_callback(lambda _: self.checks.pop(name, None))

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The connection pool, CPU workers, replica events, health loop and cluster."""
        router = self.router
        client = self.client = self._client()
        self.workers = CPUWorkers(self.config.prompt_threads)
        self.proxy = Proxy(router, client, self._suspect, self.replica_key)
        router.start_events()
        tasks = [asyncio.create_task(health_loop(router, client))]
        if self.cluster is not None:
            self.cluster.attach(router)
            tasks.append(asyncio.create_task(self.cluster.run()))
        try:
            yield
        finally:
            pending = [*tasks, *self.checks.values()]
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            router.stop_events()
            self.workers.close()
            await client.aclose()

    # ------------------------------------------------------------ routed requests

    def request_key(
        self, endpoint: str, data: dict[str, Any], session: str | None
    ) -> RequestKey | None:
        """Renders, tokenizes and hashes the prompt (CPU work: run off the event loop).
        Without a key the request is still routed, by load."""
        try:
            key = self.hasher.key(
                endpoint, data, session, served_adapters(self.router.replicas.values())
            )
        except ValueError:
            return None  # invalid: a replica answers with the precise 4xx
        except Exception:
            logger.exception("no routing key for a %s request", endpoint)
            return None
        for block_size in {r.block_size for r in self.router.replicas.values()}:
            key.hashes(block_size)  # cached on the key for the decision
        return key

    async def routed(self, request: Request, path: str, endpoint: str) -> Response:
        """A generation request, to the replica the policy picks for its prompt."""
        router = self.router
        request_id = request.headers.get("x-request-id", "")[:200] or uuid.uuid4().hex
        body = await read_body(request, self.config.max_body_bytes)
        data = parse_json(body)
        if data is not None and "kv_transfer_params" in data:
            del data["kv_transfer_params"]  # the router's to set, never a client's
            body = json.dumps(data).encode()
        stream = bool(data.get("stream")) if data else False
        try:
            ticket = await self.admission.acquire()  # also bounds the prompts being hashed
        except APIError:
            router.metrics.rejected.labels("queue_full").inc()
            raise
        try:
            key = None
            if data is not None:
                session = request.headers.get("x-session-id")
                key = await self.workers.run(lambda: self.request_key(endpoint, data, session))
            reply = await unless_client_leaves(
                request,
                self.proxy.forward(
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

    # ------------------------------------------------------------ any replica

    async def passthrough(self, request: Request, path: str) -> Response:
        """Any healthy replica answers (models, tokenize, version)."""
        body = await read_body(request, self.config.max_body_bytes)
        headers = upstream_headers(
            dict(request.headers), ("content-type", "authorization", "x-request-id"),
            api_key=self.replica_key,
        )  # fmt: skip
        healthy = self.router.healthy()
        self.turn += 1
        for i in range(len(healthy)):
            r = healthy[(self.turn + i) % len(healthy)]
            try:
                resp = await self.client.request(
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

    async def reset_prefix_caches(self, request: Request) -> JSONResponse:
        """Every healthy replica's prefix cache reset: 200, or 409 naming each's answer."""
        headers = upstream_headers(
            dict(request.headers), ("authorization",), api_key=self.replica_key
        )
        out = {}
        for r in self.router.healthy():
            try:
                resp = await self.client.post(r.url + "/reset_prefix_cache", headers=headers)
                out[r.name] = resp.status_code
            except httpx.HTTPError as e:
                out[r.name] = type(e).__name__
        ok = all(v == 200 for v in out.values())
        return JSONResponse({"reset": ok, "replicas": out}, status_code=200 if ok else 409)
