"""What a benchmarked tokenmill server says it runs, for the report: its kernel switches in
force (`/server_info`'s engine.kernels: the integer-dot row limit it measured, the native
build's kernel kind), so results say which kernels were on. Peers without /server_info: None."""

from __future__ import annotations

from typing import Any

import httpx

from tokenmill.bench.config import Target


async def server_kernels(client: httpx.AsyncClient, target: Target) -> dict[str, Any] | None:
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    try:
        r = await client.get(
            f"{target.base_url.rstrip('/')}/server_info", headers=headers, timeout=10.0
        )
        info = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    if not isinstance(info, dict):
        return None
    kernels = _at(info, "engine", "kernels")
    if kernels is None:  # a server that reports only the switches it was configured with
        kernels = _at(info, "config", "engine", "kernel_config")
    return kernels


def _at(value: Any, *keys: str) -> dict[str, Any] | None:
    """value[k1][k2]... where each is a mapping, else None."""
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, dict) else None
