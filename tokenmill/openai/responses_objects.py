"""The objects /v1/responses answers with: the response object, its output items and
content parts, usage, and the typed stream events that build them — their names, field
names and small builders. The server builds them (server/responses/); the gateway reads and
rewrites them as parsed JSON (gateway/endpoints/responses.py). Plain dicts: nothing here
validates.

A stream: response.created, response.in_progress, then per output item
response.output_item.added ... response.output_item.done (a message's text through
content_part.added, output_text.delta*, output_text.done, content_part.done; a function
call's arguments through function_call_arguments.delta*, .done), and one terminal event
(response.completed, .incomplete or .failed) carrying the whole response. Every event has a
sequence_number."""

from __future__ import annotations

from typing import Any

RESPONSE = "response"  # the object's name, and the field of events that carry one
ASSISTANT = "assistant"

# item and content part types
MESSAGE = "message"
FUNCTION_CALL = "function_call"
FUNCTION_CALL_OUTPUT = "function_call_output"
INPUT_TEXT = "input_text"
OUTPUT_TEXT = "output_text"
REFUSAL = "refusal"

# stream event types
RESPONSE_CREATED = "response.created"
RESPONSE_IN_PROGRESS = "response.in_progress"
RESPONSE_COMPLETED = "response.completed"
RESPONSE_INCOMPLETE = "response.incomplete"
RESPONSE_FAILED = "response.failed"
TERMINAL_EVENTS = (RESPONSE_COMPLETED, RESPONSE_INCOMPLETE, RESPONSE_FAILED)
OUTPUT_ITEM_ADDED = "response.output_item.added"
OUTPUT_ITEM_DONE = "response.output_item.done"
CONTENT_PART_ADDED = "response.content_part.added"
CONTENT_PART_DONE = "response.content_part.done"
OUTPUT_TEXT_DELTA = "response.output_text.delta"
OUTPUT_TEXT_DONE = "response.output_text.done"
FUNCTION_CALL_ARGUMENTS_DELTA = "response.function_call_arguments.delta"
FUNCTION_CALL_ARGUMENTS_DONE = "response.function_call_arguments.done"
ERROR_EVENT = "error"

# field names
TYPE = "type"
ID = "id"
STATUS = "status"
OUTPUT = "output"
CONTENT = "content"
TEXT = "text"
NAME = "name"
ARGUMENTS = "arguments"
USAGE = "usage"
ITEM = "item"
PART = "part"
ITEM_ID = "item_id"
OUTPUT_INDEX = "output_index"
CONTENT_INDEX = "content_index"
DELTA = "delta"
SEQUENCE_NUMBER = "sequence_number"


# ------------------------------------------------------------------ objects


def usage(
    input_tokens: int, output_tokens: int, cached_tokens: int, cache_write_tokens: int | None = 0
) -> dict[str, Any]:
    """`cache_write_tokens` None: left out (the gateway's own answers)."""
    details: dict[str, Any] = {"cached_tokens": cached_tokens}
    if cache_write_tokens is not None:
        details["cache_write_tokens"] = cache_write_tokens
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": details,
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def usage_tokens(value: Any) -> tuple[int, int, int]:
    """(input, cached, output) of a usage object (zeros when it is not one)."""
    if not isinstance(value, dict):
        return 0, 0, 0
    details = value.get("input_tokens_details") or {}
    return (
        int(value.get("input_tokens") or 0),
        int(details.get("cached_tokens") or 0),
        int(value.get("output_tokens") or 0),
    )


def response_object(
    response_id: str,
    created_at: int,
    status: str,
    settings: dict[str, Any],
    output: list[dict[str, Any]],
    usage_: dict[str, Any] | None,
    completed_at: int | None = None,
    error: dict[str, Any] | None = None,
    incomplete_details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The response object; `settings` are the request's as it echoes them (model,
    instructions, tools, temperature, ...)."""
    return {
        ID: response_id,
        "object": RESPONSE,
        "created_at": created_at,
        STATUS: status,
        "completed_at": completed_at,
        "error": error,
        "incomplete_details": incomplete_details,
        **settings,
        OUTPUT: output,
        USAGE: usage_,
    }


def settings(
    model: str,
    *,
    instructions: str | None = None,
    max_output_tokens: int | None = None,
    previous_response_id: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: Any = "auto",
    parallel_tool_calls: bool = True,
    temperature: float = 1.0,
    top_p: float = 1.0,
    text: dict[str, Any] | None = None,
    truncation: str = "disabled",
    metadata: dict[str, str] | None = None,
    user: str | None = None,
    background: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    """The request's settings as every response object repeats them (the defaults: what
    a request that sets nothing gets)."""
    return {
        "model": model,
        "instructions": instructions,
        "max_output_tokens": max_output_tokens,
        "previous_response_id": previous_response_id,
        "tools": tools or [],
        "tool_choice": tool_choice,
        "parallel_tool_calls": parallel_tool_calls,
        "temperature": temperature,
        "top_p": top_p,
        TEXT: text if text is not None else {"format": {TYPE: "text"}},
        "truncation": truncation,
        "metadata": metadata or {},
        "user": user,
        "background": background,
        **extra,
    }


def text_part(text: str) -> dict[str, Any]:
    """An output message's text."""
    return {TYPE: OUTPUT_TEXT, TEXT: text, "annotations": [], "logprobs": []}


def message_item(
    item_id: str, content: list[dict[str, Any]], status: str, role: str = ASSISTANT
) -> dict[str, Any]:
    return {ID: item_id, TYPE: MESSAGE, "role": role, STATUS: status, CONTENT: content}


def function_call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str
) -> dict[str, Any]:
    return {
        ID: item_id,
        TYPE: FUNCTION_CALL,
        "call_id": call_id,
        NAME: name,
        ARGUMENTS: arguments,
        STATUS: status,
    }


# ------------------------------------------------------------------ stream events


def text_ref(item_id: str, output_index: int, content_index: int = 0) -> dict[str, Any]:
    """Where a text event's text goes: an item's content part."""
    return {ITEM_ID: item_id, OUTPUT_INDEX: output_index, CONTENT_INDEX: content_index}


def text_ref_of(event: dict[str, Any]) -> dict[str, Any]:
    """The text reference an event carries."""
    return {k: event[k] for k in (ITEM_ID, OUTPUT_INDEX, CONTENT_INDEX) if k in event}


def response_event(kind: str, response: dict[str, Any]) -> dict[str, Any]:
    return {TYPE: kind, RESPONSE: response}


def output_item_added(output_index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {TYPE: OUTPUT_ITEM_ADDED, OUTPUT_INDEX: output_index, ITEM: item}


def output_item_done(output_index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {TYPE: OUTPUT_ITEM_DONE, OUTPUT_INDEX: output_index, ITEM: item}


def content_part_added(ref: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    return {TYPE: CONTENT_PART_ADDED, **ref, PART: part}


def content_part_done(ref: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    return {TYPE: CONTENT_PART_DONE, **ref, PART: part}


def output_text_delta(ref: dict[str, Any], delta: str) -> dict[str, Any]:
    return {TYPE: OUTPUT_TEXT_DELTA, **ref, DELTA: delta, "logprobs": []}


def output_text_done(ref: dict[str, Any], text: str) -> dict[str, Any]:
    return {TYPE: OUTPUT_TEXT_DONE, **ref, TEXT: text, "logprobs": []}


def function_call_arguments_delta(item_id: str, output_index: int, delta: str) -> dict[str, Any]:
    return {
        TYPE: FUNCTION_CALL_ARGUMENTS_DELTA,
        ITEM_ID: item_id,
        OUTPUT_INDEX: output_index,
        DELTA: delta,
    }


def function_call_arguments_done(item_id: str, output_index: int, arguments: str) -> dict[str, Any]:
    return {
        TYPE: FUNCTION_CALL_ARGUMENTS_DONE,
        ITEM_ID: item_id,
        OUTPUT_INDEX: output_index,
        ARGUMENTS: arguments,
    }


def message_events(output_index: int, item: dict[str, Any], text: str) -> list[dict[str, Any]]:
    """A whole message item with one text, as the events that stream it (`item` as done)."""
    ref = text_ref(item[ID], output_index)
    opened = {**item, STATUS: "in_progress", CONTENT: []}
    return [
        output_item_added(output_index, opened),
        content_part_added(ref, text_part("")),
        output_text_delta(ref, text),
        output_text_done(ref, text),
        content_part_done(ref, text_part(text)),
        output_item_done(output_index, item),
    ]


def error_event(code: str, message: str) -> dict[str, Any]:
    return {TYPE: ERROR_EVENT, "code": code, "message": message, "param": None}
