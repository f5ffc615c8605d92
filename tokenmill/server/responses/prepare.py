"""A /v1/responses request -> the engine request to run: the conversation (after a previous
response's items), the chat prompt (truncated if asked), the sampling parameters and output
constraint, through the same functions the chat endpoint uses. Every problem is a 4xx that
names the Responses field."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from tokenmill.engine.async_llm import GenerationRequest
from tokenmill.openai.protocol import ChatCompletionRequest
from tokenmill.openai.responses_protocol import ResponsesRequest
from tokenmill.server.chat_prompt import request_tools
from tokenmill.server.constraints import build_constraint, tools_to_force
from tokenmill.server.errors import APIError, bad_request
from tokenmill.server.responses.conversation import (
    Item,
    chat_request,
    context_items,
    cut_points,
    input_items,
    item_id,
)
from tokenmill.server.responses.objects import ResponseObject, echo
from tokenmill.server.responses.store import ResponseStore
from tokenmill.server.sampling import sampling_params
from tokenmill.server.serving_chat import parallel_calls, render_prompt
from tokenmill.server.state import AccessRecord, ServerState

# chat field names in shared errors -> the Responses request's
_PARAMS = {
    "response_format": "text.format",
    "messages": "input",
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
}


@dataclass
class Prepared:
    """One response about to run: its object, conversation and engine request."""

    obj: ResponseObject
    owner: str
    store: bool
    context: list[Item]  # the items it answers (what the next turn continues from)
    generation: GenerationRequest
    parse_tools: bool
    parallel: bool
    record: AccessRecord
    save_lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def not_found(response_id: str, param: str | None = None) -> APIError:
    return APIError(
        404, f"Response with id {response_id!r} not found.", "invalid_request_error", param
    )


@contextmanager
def _responses_params() -> Iterator[None]:
    """Errors raised by the shared chat functions name the Responses request's fields."""
    try:
        yield
    except APIError as e:
        param = _PARAMS.get(e.param or "", e.param)
        message = e.message
        for old, new in _PARAMS.items():
            if message.startswith(f"{old}: "):
                message = f"{new}: {message[len(old) + 2 :]}"
        raise APIError(e.status, message, e.type, param, e.code, e.headers) from e


def check_modes(req: ResponsesRequest, store: ResponseStore | None) -> None:
    if req.background and not req.store:
        raise bad_request("background: requires store to be true", param="background")
    if req.background and req.stream:
        raise bad_request(
            "background: streaming a background response is not supported yet", "stream"
        )
    if store is None and (req.background or req.previous_response_id):
        param = "background" if req.background else "previous_response_id"
        raise bad_request(f"{param}: this server stores no responses (--response-store off)", param)


async def prepare(
    state: ServerState,
    store: ResponseStore | None,
    req: ResponsesRequest,
    owner: str,
    request_id: str,
) -> Prepared:
    with _responses_params():
        model = state.check_model(req.model)
        state.check_accepting()
        check_modes(req, store)
        previous: list[Item] = []
        if req.previous_response_id is not None:
            assert store is not None
            prev = await store.aget(req.previous_response_id, owner)
            if prev is None:
                raise not_found(req.previous_response_id, "previous_response_id")
            if prev.status in ("queued", "in_progress"):
                raise bad_request(
                    f"previous_response_id: response {prev.id} is still {prev.status}",
                    "previous_response_id",
                )
            previous = prev.context + prev.response["output"]
        items = context_items(previous, input_items(req), req.truncation)
        chat, prompt, prompt_ids, items = await _render(state, req, items, model)
        forced = tools_to_force(chat)
        constraint = await build_constraint(state.get_grammar_compiler, chat, forced)
        params = sampling_params(state, req, len(prompt_ids), constraint)
        response_id = item_id("resp")
        return Prepared(
            obj=ResponseObject(response_id, echo(req, model)),
            owner=owner,
            store=req.store and store is not None,
            context=items,
            generation=GenerationRequest(
                response_id,
                prompt_ids,
                params,
                prompt,
                req.priority,
                req.cache_salt,
                lora_name=state.lora_for(req.model),
            ),  # fmt: skip
            parse_tools=request_tools(chat) is not None,
            parallel=parallel_calls(chat),
            record=AccessRecord(request_id, response_id, "responses", len(prompt_ids)),
        )


async def _render(
    state: ServerState, req: ResponsesRequest, items: list[Item], model: str
) -> tuple[ChatCompletionRequest, str, list[int], list[Item]]:
    """The prompt of the conversation. Truncation "auto": when it does not fit (with room for
    max_output_tokens, or one token), the oldest items are dropped up to a user message (the
    fewest that make it fit, found by bisection); when nothing fits the 400 says so."""
    chat = chat_request(req, items, model)
    prompt, ids = await render_prompt(state, chat)
    limit = state.engine.max_model_len - (req.max_output_tokens or 1)
    if req.truncation != "auto" or len(ids) <= limit:
        return chat, prompt, ids, items
    found: tuple[ChatCompletionRequest, str, list[int], list[Item]] | None = None
    cuts = cut_points(items)
    lo, hi = 0, len(cuts) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        kept = items[cuts[mid] :]
        trial = chat_request(req, kept, model)
        trial_prompt, trial_ids = await render_prompt(state, trial)
        if len(trial_ids) <= limit:
            found, hi = (trial, trial_prompt, trial_ids, kept), mid - 1
        else:
            lo = mid + 1
    return found or (chat, prompt, ids, items)
