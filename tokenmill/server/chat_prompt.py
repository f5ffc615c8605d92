"""A chat request -> prompt text and token ids: the tools fallback, the chat template, and
tokenization that keeps message text as text. The server and the router call this, so both
compute the same token ids (and so the same prefix-cache block hashes)."""

from __future__ import annotations

from typing import Any

from tokenmill.inputs.chat import render_chat
from tokenmill.model.chat_template import ChatTemplate, ChatTemplateError
from tokenmill.model.tokenizer import Tokenizer
from tokenmill.openai.protocol import ChatCompletionRequest
from tokenmill.server.errors import bad_request
from tokenmill.server.tool_messages import template_messages


def request_tools(req: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The request's tools as the template sees them (none with tool_choice "none")."""
    if not req.tools or req.tool_choice == "none":
        return None
    return [t.model_dump(by_alias=True, exclude_none=True) for t in req.tools]


def render_chat_request(
    req: ChatCompletionRequest, tokenizer: Tokenizer, chat_template: ChatTemplate
) -> tuple[str, list[int]]:
    """400 (APIError) when the template rejects the conversation or the kwargs."""
    messages, tools = template_messages(chat_template, req.messages, request_tools(req))
    kwargs = req.chat_template_kwargs
    if req.reasoning_effort is not None and isinstance(kwargs, dict | None):
        kwargs = {"reasoning_effort": req.reasoning_effort, **(kwargs or {})}
    try:
        return render_chat(
            chat_template,
            tokenizer,
            messages,
            tools,
            req.add_generation_prompt,
            req.continue_final_message,
            kwargs,
            req.special_tokens_in_content,
        )
    except ChatTemplateError as e:
        param = "chat_template_kwargs" if str(e).startswith("chat_template_kwargs") else "messages"
        raise bad_request(str(e), param=param) from e
