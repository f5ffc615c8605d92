"""One batch line through the same code as the HTTP endpoint it names: the same request
model, validation, prompt rendering, sampling parameters and response building, so a line
answers as the interactive request would (at temperature 0, the same tokens)."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from tokenmill.openai.protocol import ChatCompletionRequest, CompletionRequest
from tokenmill.server.errors import APIError, bad_request
from tokenmill.server.json_body import validation_error
from tokenmill.server.serving_chat import create_chat_completion
from tokenmill.server.serving_completion import create_completion
from tokenmill.server.state import ServerState

logger = logging.getLogger(__name__)

Handler = Callable[..., Awaitable[Any]]
HANDLERS: dict[str, tuple[type[BaseModel], Handler]] = {
    "/v1/chat/completions": (ChatCompletionRequest, create_chat_completion),
    "/v1/completions": (CompletionRequest, create_completion),
}
# 503s that say "not now" (the server drains, the engine is gone, the queue is full): the
# line is not answered; it runs again later (after a restart if need be).
RETRY_CODES = ("server_busy", "server_shutting_down", "engine_dead")


class LineNotRun(Exception):
    """The line could not run now; nothing is recorded for it. `retry_after_s`: it may run
    after this long (its key's rate limit)."""

    def __init__(self, error: APIError, retry_after_s: float | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.retry_after_s = retry_after_s


class _Detached:
    """The `raw` request of a batch line: there is no client to go away."""

    async def is_disconnected(self) -> bool:
        return False


@dataclass(frozen=True)
class LineResult:
    status_code: int
    body: dict[str, Any]


def sequences(body: dict[str, Any]) -> int:
    """How many sequences a line asks the engine for (n x prompts), for the in-flight limit."""
    n = body.get("n")
    prompts = body.get("prompt")
    count = (
        len(prompts)
        if isinstance(prompts, list) and prompts and not isinstance(prompts[0], int)
        else 1
    )
    return max(1, n if isinstance(n, int) and 0 < n < 1 << 16 else 1) * max(1, count)


async def run_line(
    state: ServerState,
    url: str,
    body: dict[str, Any],
    request_id: str,
    priority: int,
    gateway: Any = None,
    owner: str = "",
) -> LineResult:
    """The line's HTTP status and JSON body; LineNotRun when it could not run now. With a
    gateway, the line goes through it as the batch's owner (its key's limits and ledger)."""
    model, handler = HANDLERS[url]
    try:
        req = model.model_validate(body)
    except ValidationError as e:
        err = validation_error(e)
        return LineResult(err.status, err.body())
    if getattr(req, "stream", False):
        err = bad_request("stream: is not supported in a batch", param="stream")
        return LineResult(err.status, err.body())
    if gateway is not None:
        body = {**body, "priority": max(req.priority, priority)}
        return await _through_gateway(gateway, owner, url, body, request_id)
    req = req.model_copy(update={"priority": max(req.priority, priority)})  # never ahead
    try:
        response = await handler(state, req, _Detached(), request_id)
    except APIError as e:
        if e.status == 503 and e.code in RETRY_CODES:
            raise LineNotRun(e) from None
        return LineResult(e.status, e.body())
    except Exception as e:  # not expected: recorded as the line's 500, never retried
        logger.exception("batch line %s failed", request_id)
        err = APIError(500, f"internal error: {type(e).__name__}", "internal_server_error")
        return LineResult(500, err.body())
    return LineResult(response.status_code, json.loads(response.body))


async def _through_gateway(
    gateway: Any, owner: str, url: str, body: dict[str, Any], request_id: str
) -> LineResult:
    from tokenmill.gateway.batch_lines import run_line_as_key

    answer = await run_line_as_key(gateway, owner, url, body, request_id)
    error = answer.body.get("error") if isinstance(answer.body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    if answer.retry_after_s is not None or (answer.status == 503 and code in RETRY_CODES):
        message = error.get("message", "") if isinstance(error, dict) else ""
        raise LineNotRun(APIError(answer.status, message, code=code), answer.retry_after_s)
    return LineResult(answer.status, answer.body)
