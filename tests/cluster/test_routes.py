"""`GET /cluster` and `POST /cluster/scale` on the router app (fake workers and replicas):
the router's key guards them; with a gateway, scaling takes its admin key."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.cluster.test_manager import FakeLauncher
from tests.gateway.harness import ADMIN_KEY, write_config
from tokenmill.cluster import routes as cluster_routes
from tokenmill.cluster.launcher import WorkerRequest
from tokenmill.cluster.manager import ClusterManager
from tokenmill.router.app import build_router_app
from tokenmill.router.config import RouterConfig
from tokenmill.router.prompts import PromptHasher
from tokenmill.router.router import Router


async def replica(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/server_info":
        return httpx.Response(200, content=b'{"engine": {"block_size": 16, "pid": 1}}')
    return httpx.Response(200)


@contextlib.asynccontextmanager
async def app_with_cluster(**auth) -> AsyncIterator[tuple[httpx.AsyncClient, ClusterManager]]:
    manager = ClusterManager(FakeLauncher(), lambda role: WorkerRequest(role), interval_s=0.05)
    specs = manager.start([WorkerRequest()])
    router = Router(RouterConfig(health_interval_s=0.05), specs)
    app = build_router_app(router, PromptHasher(None, None), httpx.MockTransport(replica),
                           cluster=manager, extra_routes=[cluster_routes.router], **auth)  # fmt: skip
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://router") as client,
    ):
        yield client, manager


@pytest.mark.anyio
async def test_scale_through_the_router_with_its_key():
    async with app_with_cluster(api_key="sk-router") as (client, manager):
        auth = {"Authorization": "Bearer sk-router"}
        assert (await client.post("/cluster/scale", json={"replicas": 2})).status_code == 401
        r = await client.post("/cluster/scale", json={"replicas": "two"}, headers=auth)
        assert r.status_code == 400 and r.json()["error"]["param"] == "replicas"
        r = await asyncio.wait_for(
            client.post("/cluster/scale", json={"replicas": 3}, headers=auth), 10
        )
        assert r.status_code == 200, r.text
        assert r.json()["scaled"] == [{"role": "both", "before": 1, "after": 3}]
        workers = (await client.get("/cluster", headers=auth)).json()["workers"]
        assert [w["status"] for w in workers] == ["ready"] * 3
        assert all(w["replica"] for w in workers)
        r = await client.post("/cluster/scale", json={"replicas": 0}, headers=auth)
        assert r.status_code == 400
        r = await client.post("/cluster/scale", json={"replicas": 1}, headers=auth)
        assert r.status_code == 200 and len(manager.workers) == 1


@pytest.mark.anyio
async def test_with_a_gateway_scaling_needs_the_admin_key(tmp_path):
    config = str(write_config(tmp_path))
    async with app_with_cluster(gateway_config=config) as (client, manager):
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        reply = await client.post("/admin/keys", json={"name": "client"}, headers=admin)
        user = {"Authorization": f"Bearer {reply.json()['key']}"}
        assert (await client.get("/cluster", headers=user)).status_code == 403
        assert (await client.get("/cluster", headers=admin)).status_code == 200
        r = await client.post("/cluster/scale", json={"replicas": 2}, headers=user)
        assert r.status_code == 403 and len(manager.workers) == 1
        r = await asyncio.wait_for(
            client.post("/cluster/scale", json={"replicas": 2}, headers=admin), 10
        )
        assert r.status_code == 200 and len(manager.workers) == 2


@pytest.mark.anyio
async def test_hostile_scale_bodies_are_400s_and_a_scale_beside_them_completes():
    nested: object = 1
    for _ in range(200):
        nested = {"replicas": nested}
    bad_bodies = [
        b"", b"{", b"null", b"[]", b'"replicas"', b'{"replicas": 2.0}', b'{"replicas": 1e400}',
        b'{"replicas": -5}', b'{"replicas": 99999999999999999999}', b'{"replicas": NaN}',
        b'{"prefill": 1, "decode": "x"}', b'{"' + b"r" * 10_000 + b'": 1}',
        httpx.Request("POST", "/", json=nested).content, b'{"replicas": [' + b"1," * 200_000 + b"1]}",
    ]  # fmt: skip
    async with app_with_cluster(api_key="sk-router") as (client, manager):
        auth = {"Authorization": "Bearer sk-router", "Content-Type": "application/json"}

        async def bad(body: bytes) -> httpx.Response:
            return await client.post("/cluster/scale", content=body, headers=auth)

        good = client.post("/cluster/scale", json={"replicas": 2}, headers=auth)
        replies = await asyncio.wait_for(asyncio.gather(good, *(bad(b) for b in bad_bodies)), 20)
        assert replies[0].status_code == 200, replies[0].text
        for body, r in zip(bad_bodies, replies[1:], strict=True):
            assert r.status_code in (400, 413), (body[:40], r.status_code, r.text[:200])
            assert set(r.json()["error"]) >= {"message", "type", "param", "code"}, r.text[:200]
        assert len(manager.workers) == 2
        assert (await client.get("/health")).status_code == 200
