"""The router's HTTP routes, one APIRouter per concept; build_router_app (router/app.py)
includes them. Handlers read the RouterFront (router/front.py) from app.state.front.

    generation.py   /v1/chat/completions, /v1/completions: routed by prompt and load
    passthrough.py  /v1/models, /tokenize, /detokenize: any healthy replica answers
    health.py       /version, /health, /metrics
    admin.py        /router_info, /reset_prefix_cache

`/cluster` (cluster/routes.py) and the UI's data (ui/routes.py) have their own routers."""

from __future__ import annotations

from fastapi import Request

from tokenmill.router.front import RouterFront


def front(request: Request) -> RouterFront:
    return request.app.state.front
