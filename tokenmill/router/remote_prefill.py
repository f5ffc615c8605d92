"""The two requests of a disaggregated one: the prefill worker's (the prompt, one token, its
blocks served under the transfer id) and the decode worker's (the client's request, loading
the prompt's KV from the prefill worker). Both are sent at once: the decode worker pulls
each chunk of blocks as soon as the prefill step that computed it returns."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx

from tokenmill.router.disagg import DisaggDecision
from tokenmill.router.router import Router

logger = logging.getLogger("tokenmill.router")

# request fields that make a prompt's KV unusable from elsewhere (every prompt position is
# recomputed for its logprobs) or that only concern the output
_NOT_DISAGGREGATED = ("echo", "prompt_logprobs")
_OUTPUT_ONLY = ("max_completion_tokens", "stream_options", "min_tokens", "logprobs",
                "top_logprobs", "best_of")  # fmt: skip


def disaggregable(data: dict[str, Any] | None) -> bool:
    return data is not None and not any(data.get(k) for k in _NOT_DISAGGREGATED)


def prefill_body(data: dict[str, Any], transfer_id: str) -> bytes:
    body = {k: v for k, v in data.items() if k not in _OUTPUT_ONLY}
    body.update(max_tokens=1, stream=False, n=1)
    body["kv_transfer_params"] = {"do_remote_decode": True, "transfer_id": transfer_id}
    return json.dumps(body).encode()


def decode_body(data: dict[str, Any], dd: DisaggDecision) -> bytes:
    assert dd.prefill is not None and dd.prefill.kv_endpoint is not None
    body = dict(data)
    body["kv_transfer_params"] = {
        "do_remote_prefill": True,
        "transfer_id": dd.transfer_id,
        "remote_endpoint": dd.prefill.kv_endpoint,
    }
    return json.dumps(body).encode()


async def run_prefill(
    router: Router,
    client: httpx.AsyncClient,
    dd: DisaggDecision,
    path: str,
    data: dict[str, Any],
    headers: dict[str, bytes],
) -> None:
    """The prefill worker's request; a failure only costs the decode worker a recompute."""
    assert dd.prefill is not None and dd.booking is not None
    name = dd.prefill.name
    try:
        resp = await client.post(dd.prefill.url + path, content=prefill_body(data, dd.transfer_id),
                                 headers=headers)  # fmt: skip
        if resp.status_code != 200:
            router.metrics.kv_transfer_prefill_errors.labels(name).inc()
            logger.warning("remote prefill %s on %s: HTTP %d %s", dd.transfer_id, name,
                           resp.status_code, resp.text[:300])  # fmt: skip
    except httpx.HTTPError as e:
        router.metrics.kv_transfer_prefill_errors.labels(name).inc()
        logger.warning("remote prefill %s on %s failed: %s", dd.transfer_id, name, e)
        if isinstance(e, httpx.ConnectError):
            router.mark_down(name, f"{type(e).__name__}: {e}")
    finally:
        router.loads.finish(dd.booking)
