"""The objects /v1/chat/completions and /v1/completions answer with, whole and streamed:
their names, field names and small builders. The server builds them (serving_chat.py,
serving_completion.py); the gateway reads and rewrites them as parsed JSON
(gateway/endpoints/chat.py). Plain dicts: nothing here validates.

    chat.completion        {id, object, created, model, choices: [{index, message,
                            logprobs, finish_reason}], usage, system_fingerprint}
    chat.completion.chunk  {id, object, created, model, choices: [{index, delta,
                            logprobs, finish_reason}], usage?}
    text_completion        the same with choices [{index, text, logprobs, finish_reason}]
                           (whole and streamed)
"""

from __future__ import annotations

from typing import Any

# object names and id prefixes
CHAT_COMPLETION = "chat.completion"
CHAT_COMPLETION_CHUNK = "chat.completion.chunk"
TEXT_COMPLETION = "text_completion"  # whole and streamed alike
CHAT_ID_PREFIX = "chatcmpl"
COMPLETION_ID_PREFIX = "cmpl"
ASSISTANT = "assistant"

# finish reasons besides the engine's own ("stop", "length", ...)
FINISH_STOP = "stop"
FINISH_TOOL_CALLS = "tool_calls"  # the choice ended on its own with calls
REASONING_CONTENT = "reasoning_content"  # the thinking split from the answer (vLLM's name)
FINISH_CONTENT_FILTER = "content_filter"  # a guardrail replaced the answer

# field names
CHOICES = "choices"
USAGE = "usage"
INDEX = "index"
MESSAGE = "message"
DELTA = "delta"
CONTENT = "content"  # a message's or a delta's text
TEXT = "text"  # a text completion choice's text
TOOL_CALLS = "tool_calls"
FUNCTION = "function"
NAME = "name"
ARGUMENTS = "arguments"
ID = "id"
LOGPROBS = "logprobs"
FINISH_REASON = "finish_reason"
STOP_REASON = "stop_reason"  # vLLM's: the stop string or token id that ended the choice
STREAM_OPTIONS = "stream_options"
INCLUDE_USAGE = "include_usage"
CONTINUOUS_USAGE_STATS = "continuous_usage_stats"


# ------------------------------------------------------------------ usage


def usage(prompt_tokens: int, completion_tokens: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def usage_tokens(value: Any) -> tuple[int, int, int]:
    """(prompt, cached, completion) of a usage object (zeros when it is not one)."""
    if not isinstance(value, dict):
        return 0, 0, 0
    details = value.get("prompt_tokens_details") or {}
    return (
        int(value.get("prompt_tokens") or 0),
        int(details.get("cached_tokens") or 0),
        int(value.get("completion_tokens") or 0),
    )


# ------------------------------------------------------------------ whole objects


def completion(
    completion_id: str,
    obj: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    usage_: dict[str, Any],
) -> dict[str, Any]:
    """A whole chat.completion or text_completion."""
    return {
        ID: completion_id,
        "object": obj,
        "created": created,
        "model": model,
        CHOICES: choices,
        USAGE: usage_,
        "system_fingerprint": None,
    }


def assistant_message(
    content: str | None, tool_calls: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {"role": ASSISTANT, CONTENT: content, "refusal": None, TOOL_CALLS: tool_calls or []}


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """A whole call, in a message's tool_calls."""
    return {ID: call_id, "type": FUNCTION, FUNCTION: {NAME: name, ARGUMENTS: arguments}}


def chat_choice(
    index: int,
    message: dict[str, Any],
    logprobs: Any,
    finish_reason: str | None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        INDEX: index,
        MESSAGE: message,
        LOGPROBS: logprobs,
        FINISH_REASON: finish_reason,
        **extra,
    }


def text_choice(
    index: int, text: str, logprobs: Any, finish_reason: str | None, **extra: Any
) -> dict[str, Any]:
    """A text completion's choice (whole, or one streamed piece)."""
    return {INDEX: index, TEXT: text, LOGPROBS: logprobs, FINISH_REASON: finish_reason, **extra}


# ------------------------------------------------------------------ streamed


def envelope(completion_id: str, obj: str, created: int, model: str) -> dict[str, Any]:
    """What every chunk of one stream repeats."""
    return {ID: completion_id, "object": obj, "created": created, "model": model}


def chunk(head: dict[str, Any], choices: list[dict[str, Any]]) -> dict[str, Any]:
    """One chunk: the stream's envelope and these choices (`usage` is set by the caller,
    when the client asked for it: null on all but the last)."""
    return {**head, CHOICES: choices}


def delta_choice(
    index: int,
    delta: dict[str, Any],
    logprobs: Any = None,
    finish_reason: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A chat chunk's choice."""
    return {INDEX: index, DELTA: delta, LOGPROBS: logprobs, FINISH_REASON: finish_reason, **extra}


def role_delta() -> dict[str, Any]:
    """A choice's first delta."""
    return {"role": ASSISTANT, CONTENT: ""}


def content_delta(text: str) -> dict[str, Any]:
    return {CONTENT: text}


def reasoning_delta(text: str) -> dict[str, Any]:
    """A streamed piece of the reasoning (vLLM's `reasoning_content`)."""
    return {REASONING_CONTENT: text}


def tool_call_start(index: int, call_id: str, name: str) -> dict[str, Any]:
    """A streamed call's first piece (its arguments follow)."""
    return {INDEX: index, ID: call_id, "type": FUNCTION, FUNCTION: {NAME: name, ARGUMENTS: ""}}


def tool_call_arguments(index: int, arguments: str) -> dict[str, Any]:
    """More of a streamed call's arguments."""
    return {INDEX: index, FUNCTION: {ARGUMENTS: arguments}}


def tool_calls_delta(*calls: dict[str, Any]) -> dict[str, Any]:
    return {TOOL_CALLS: list(calls)}
