"""Chat messages with tools for the chat template: native when the template renders tools,
else the documented Hermes-style fallback (tools in the system prompt, calls and results as
tagged text)."""

from __future__ import annotations

import json
from typing import Any

from tokenmill.model.chat_template import ChatTemplate
from tokenmill.openai.protocol import ChatMessage
from tokenmill.structured.tools import END_TAG, START_TAG, tools_system_prompt


def _arguments(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def template_messages(
    template: ChatTemplate, messages: list[ChatMessage], tools: list[dict[str, Any]] | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) to render. Without tools, messages pass as they are."""
    if template.supports_tools:
        out = []
        for m in messages:
            d = m.to_template_dict()
            if m.tool_calls:
                d["tool_calls"] = [
                    {"id": tc.id, "type": "function",
                     "function": {"name": tc.function.name, "arguments": _arguments(tc.function.arguments)}}
                    for tc in m.tool_calls
                ]  # fmt: skip
            out.append(d)
        return out, tools
    out = []
    for m in messages:
        d = m.to_template_dict()
        if m.role == "assistant" and m.tool_calls:
            calls = "".join(
                f"\n{START_TAG}\n"
                + json.dumps(
                    {"name": tc.function.name, "arguments": _arguments(tc.function.arguments)},
                    ensure_ascii=False,
                )
                + f"\n{END_TAG}"
                for tc in m.tool_calls
            )
            d = {"role": "assistant", "content": (d["content"] + calls).lstrip("\n")}
        elif m.role == "tool":
            body = f"<tool_response>\n{d['content']}\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + body
                continue
            d = {"role": "user", "content": body, "_tool_results": True}
        out.append(d)
    for d in out:
        d.pop("_tool_results", None)
    if tools:
        prompt = tools_system_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out, None
