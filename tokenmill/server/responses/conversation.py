"""A Responses conversation -> the chat request the rest of the server serves: input items
(after a previous response's items) become chat messages, Responses' tools, tool_choice and
text.format become chat's, so templates, tool parsing and grammars are the chat endpoint's."""

from __future__ import annotations

import uuid
from typing import Any

from tokenmill.openai import responses_objects as ro
from tokenmill.openai.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    FunctionDefinition,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    SamplingKnobs,
    Tool,
    ToolCall,
)
from tokenmill.openai.responses_protocol import (
    MAX_CONTEXT_ITEMS,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionToolChoice,
    MessageItem,
    ResponsesRequest,
)
from tokenmill.server.errors import bad_request

Item = dict[str, Any]


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def input_items(req: ResponsesRequest) -> list[Item]:
    """The request's input as stored items (OpenAI's item shapes, each with an id)."""
    if isinstance(req.input, str):
        return [_message("user", [{ro.TYPE: ro.INPUT_TEXT, ro.TEXT: req.input}])]
    out = []
    for item in req.input:
        if isinstance(item, MessageItem):
            out.append(_message(item.role, _parts(item), item.id))
        elif isinstance(item, FunctionCallItem):
            call_id, name, arguments = item.call_id, item.name, item.arguments
            out.append(
                ro.function_call_item(
                    item.id or item_id("fc"), call_id, name, arguments, "completed"
                )
            )
        else:
            assert isinstance(item, FunctionCallOutputItem)
            out.append(
                {
                    ro.ID: item.id or item_id("fco"),
                    ro.TYPE: ro.FUNCTION_CALL_OUTPUT,
                    "call_id": item.call_id,
                    ro.OUTPUT: item.text(),
                    ro.STATUS: "completed",
                }
            )
    return out


def _message(role: str, content: list[dict[str, Any]], id_: str | None = None) -> Item:
    return ro.message_item(id_ or item_id("msg"), content, "completed", role)


def _parts(item: MessageItem) -> list[dict[str, Any]]:
    """Assistant text is output_text, everything else input_text (as OpenAI stores them)."""
    kind = ro.OUTPUT_TEXT if item.role == ro.ASSISTANT else ro.INPUT_TEXT
    extra: dict[str, Any] = {"annotations": []} if kind == ro.OUTPUT_TEXT else {}
    if isinstance(item.content, str):
        return [{ro.TYPE: kind, ro.TEXT: item.content, **extra}]
    parts = []
    for p in item.content:
        if p.type == ro.REFUSAL:
            parts.append({ro.TYPE: ro.REFUSAL, ro.REFUSAL: p.refusal})
        else:
            parts.append({ro.TYPE: kind, ro.TEXT: p.text, **extra})
    return parts


def context_items(previous: list[Item], new: list[Item], truncation: str) -> list[Item]:
    """previous + new within MAX_CONTEXT_ITEMS (truncation "auto" drops the oldest); every
    function_call_output answers a function_call before it."""
    items = previous + new
    if len(items) > MAX_CONTEXT_ITEMS:
        if truncation != "auto":
            raise bad_request(
                f"input: the conversation has {len(items)} items with the previous response's; "
                f"at most {MAX_CONTEXT_ITEMS} (or truncation: auto)",
                param="input",
            )
        items = items[-MAX_CONTEXT_ITEMS:]
    calls: set[str] = set()
    for i, item in enumerate(items):
        if item[ro.TYPE] == ro.FUNCTION_CALL:
            calls.add(item["call_id"])
        elif item[ro.TYPE] == ro.FUNCTION_CALL_OUTPUT and item["call_id"] not in calls:
            where = i - (len(items) - len(new))
            param = f"input.{where}.call_id" if where >= 0 else "previous_response_id"
            raise bad_request(
                f"{param}: no function_call with call_id {item['call_id'][:64]!r} before this "
                "function_call_output",
                param=param,
            )
    return items


def cut_points(items: list[Item]) -> list[int]:
    """Where truncation "auto" may start the conversation: at a user message (never between
    a call and its output)."""
    return [
        i
        for i, it in enumerate(items)
        if i > 0 and it[ro.TYPE] == ro.MESSAGE and it["role"] == "user"
    ]


def chat_messages(items: list[Item], instructions: str | None) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    if instructions is not None:
        out.append(ChatMessage(role="system", content=instructions))
    for item in items:
        kind = item[ro.TYPE]
        if kind == ro.MESSAGE:
            text = "".join(p.get(ro.TEXT, p.get(ro.REFUSAL, "")) for p in item[ro.CONTENT])
            out.append(ChatMessage(role=item["role"], content=text))
        elif kind == ro.FUNCTION_CALL:
            call = ToolCall(
                id=item["call_id"],
                function=FunctionCall(name=item[ro.NAME], arguments=item[ro.ARGUMENTS]),
            )
            # calls after an assistant message (or after each other) are one assistant turn
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                out.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
        else:
            out.append(
                ChatMessage(role="tool", content=item[ro.OUTPUT], tool_call_id=item["call_id"])
            )
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, FunctionToolChoice):
        return NamedToolChoice(type="function", function=NamedFunction(name=choice.name))
    return choice


def _response_format(req: ResponsesRequest) -> ResponseFormat | None:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ResponseFormat(type="json_object")
    spec = {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict}
    return ResponseFormat.model_validate({"type": "json_schema", "json_schema": spec})


def chat_request(req: ResponsesRequest, items: list[Item], model: str) -> ChatCompletionRequest:
    tools = None
    if req.tools:
        tools = [
            Tool(
                type="function",
                function=FunctionDefinition.model_validate(t.model_dump(exclude={"type"})),
            )
            for t in req.tools
        ]
    return ChatCompletionRequest(
        model=model,
        messages=chat_messages(items, req.instructions),
        temperature=req.temperature,
        top_p=req.top_p,
        user=req.user,
        stream=req.stream,
        tools=tools,
        tool_choice=_tool_choice(req.tool_choice),
        parallel_tool_calls=req.parallel_tool_calls,
        response_format=_response_format(req),
        chat_template_kwargs=req.chat_template_kwargs,
        **{name: getattr(req, name) for name in SamplingKnobs.model_fields},
    )
