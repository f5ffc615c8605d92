"""A batch line through the gateway, as the key that created the batch would send it: the
key's models, budget, rate limits, guardrails, tool policy and usage ledger apply to each
line. Batches run later inside the server, past the middleware: without this, a key could
reach the engine around every one of its limits by putting its requests in a file."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from tokenmill.gateway.captured import CapturedResponse
from tokenmill.gateway.exchange import Exchange, error_envelope
from tokenmill.gateway.middleware import ADAPTERS, KEY_OWNER_PREFIX

# a key's rate limits answer "not now" (another request took the turn a line waited for):
# the line runs again later; a spent budget is the line's answer
RATE_LIMIT_CODES = ("requests_per_minute", "tokens_per_minute", "parallel_limit")


@dataclass(frozen=True)
class LineAnswer:
    status: int
    body: dict[str, Any]
    retry_after_s: float | None  # rate-limited: the line may run again after this long


async def run_line_as_key(
    gateway, owner: str, url: str, body: dict[str, Any], request_id: str
) -> LineAnswer:
    """`body` sent to `url` as the key that owns the batch (`owner`, "gateway-key:<id>")."""
    key_id = owner.removeprefix(KEY_OWNER_PREFIX)
    state = gateway.keys.check_id(key_id) if owner.startswith(KEY_OWNER_PREFIX) else None
    if state is None or state.problem is not None:
        why = "no gateway key" if state is None else f"{state.problem} key"
        return LineAnswer(401, error_envelope(
            f"the batch's key can no longer run requests ({why})", "invalid_request_error",
            "invalid_api_key"), None)  # fmt: skip
    while (wait := gateway.limiter.ready_in(state.key, gateway.config.defaults)) > 0:
        await asyncio.sleep(wait)  # its key's rate limits: the line waits its turn
    data = json.dumps(body).encode()
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": url, "raw_path": url.encode(), "root_path": "",
        "query_string": b"", "client": None, "server": None, "app": gateway.root_app,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode())],
        "state": {"request_id": request_id, "gateway_key": state.key, "owner": owner},
    }  # fmt: skip
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": data, "more_body": False}
        await asyncio.Event().wait()  # never set: no client leaves; the line ends when answered
        return {"type": "http.disconnect"}

    reply = CapturedResponse()
    await Exchange(gateway, ADAPTERS[url], scope, receive, reply.send, state.key).run()
    status = reply.status
    try:
        answer = json.loads(reply.body)
    except ValueError:
        answer = error_envelope("the line's answer was not JSON", "internal_server_error", None)
        status = 500
    retry = None
    error = answer.get("error") if isinstance(answer, dict) else None
    if status == 429 and isinstance(error, dict) and error.get("code") in RATE_LIMIT_CODES:
        after = dict(reply.headers).get(b"retry-after", b"1")
        retry = float(after.decode() or 1)
    return LineAnswer(status, answer, retry)
