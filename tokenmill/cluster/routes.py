"""The router's cluster control: `GET /cluster` (workers, their state and nodes) and
`POST /cluster/scale` (what `tokenmill cluster scale` calls), behind the router's key;
with a gateway in front, both take its admin key (the gateway's middleware refuses client
keys here, and scaling checks it again). The router's
app includes `router` and puts its ClusterManager in app.state.cluster."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from tokenmill.cluster.manager import ClusterManager
from tokenmill.server.errors import APIError

router = APIRouter()
SCALE_FIELDS = {"replicas": "both", "prefill": "prefill", "decode": "decode"}


def scale_targets(body: Any) -> dict[str, int]:
    """`{"replicas": N}` and/or `{"prefill": N, "decode": M}` -> {role: count}."""
    if not isinstance(body, dict) or not body or set(body) - set(SCALE_FIELDS):
        raise APIError(400, f"scale: give one or more of {sorted(SCALE_FIELDS)}", param="body")
    out = {}
    for field, role in SCALE_FIELDS.items():
        if field in body:
            n = body[field]
            if type(n) is not int or not 0 <= n <= 1024:
                raise APIError(400, f"{field}: must be an integer in 0..1024", param=field)
            out[role] = n
    return out


def _manager(request: Request) -> ClusterManager:
    return request.app.state.cluster


@router.get("/cluster")
async def cluster_info(request: Request):
    manager = _manager(request)
    return {"launcher": manager.launcher.name, "workers": manager.describe()}


@router.post("/cluster/scale")
async def cluster_scale(request: Request):
    manager = _manager(request)
    gateway = getattr(request.app.state, "gateway", None)
    if gateway is not None:
        from tokenmill.gateway.admin import is_admin

        if not is_admin(gateway, request.headers.get("authorization", "").encode("latin-1")):
            raise APIError(403, "scaling needs the gateway's admin key", code="admin_only")
    try:
        body = await request.json()
    except ValueError:
        body = None
    targets = scale_targets(body)
    results = []
    for role, n in targets.items():
        try:
            results.append(await manager.scale(role, n))
        except ValueError as e:
            raise APIError(400, str(e), param="body") from None
        except RuntimeError as e:
            raise APIError(500, str(e), "server_error", code="scale_failed") from None
    return {"scaled": results, "workers": manager.describe()}
