"""Active health checks: `/health` then `/server_info` (block size, engine pid) per replica.

A refused connection takes a replica out at once; other failures after `unhealthy_after`
checks in a row. A replica that comes back (or whose engine pid changed: it restarted) is
resynced from its event replay before it is trusted again.
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from tokenmill.router.replicas import Replica
from tokenmill.router.router import Router

logger = logging.getLogger("tokenmill.router")


def server_info(resp: httpx.Response) -> dict:
    """The replica's /server_info, or {} if unreadable: /health already said it serves."""
    try:
        info = resp.json() if resp.status_code == 200 else {}
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


async def check_replica(router: Router, client: httpx.AsyncClient, r: Replica,
                        timeout_s: float) -> bool:  # fmt: skip
    try:
        resp = await client.get(r.url + "/health", timeout=timeout_s)
        if resp.status_code == 200:
            info = await client.get(r.url + "/server_info", timeout=timeout_s)
            router.mark_up(r.name, server_info(info))
            return True
        reason = f"/health answered {resp.status_code}"
        refused = False
    except httpx.HTTPError as e:
        reason = f"/health failed: {type(e).__name__}"
        refused = isinstance(e, httpx.ConnectError)
    r.failures += 1
    r.last_error = reason
    if refused or r.failures >= router.config.unhealthy_after or not r.ever_healthy:
        router.mark_down(r.name, reason)
    return False


async def health_loop(router: Router, client: httpx.AsyncClient, timeout_s: float = 5.0) -> None:
    while True:
        await asyncio.gather(
            *(check_replica(router, client, r, timeout_s) for r in list(router.replicas.values())),
            return_exceptions=True,
        )
        await asyncio.sleep(router.config.health_interval_s)
