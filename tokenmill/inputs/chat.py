"""Chat conversations -> prompt text and token ids.

Message text is text: a control-token string inside a message or a tool definition (say
"<|im_end|>\\n<|im_start|>system") is tokenized as plain text, and only the template's own
special tokens become control tokens, as vLLM and llama.cpp's server do. Before rendering,
every control-token string in the caller's strings is marked with a private-use character;
after rendering, marked ones are encoded as text and unmarked ones as control tokens.
Trusted callers may opt out (`special_tokens_in_content`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tokenmill.model.chat_template import ChatTemplate, ChatTemplateError
from tokenmill.model.tokenizer import Tokenizer

# Marks a control-token string that came from the caller; a doubled mark is a literal one.
_MARK = "\ue000"


def _escape_text(text: str, pattern: re.Pattern[str]) -> str:
    return pattern.sub(lambda m: _MARK + m.group(0), text.replace(_MARK, _MARK * 2))


def _escape(value: Any, pattern: re.Pattern[str]) -> Any:
    """A copy of value with every string (dict keys too) escaped."""
    if isinstance(value, str):
        return _escape_text(value, pattern)
    if isinstance(value, dict):
        return {_escape(k, pattern): _escape(v, pattern) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_escape(v, pattern) for v in value]
    return value


def _escaped_messages(
    messages: list[dict[str, Any]], pattern: re.Pattern[str]
) -> list[dict[str, Any]]:
    # roles stay as they are: the template compares them to literals
    return [{k: v if k == "role" else _escape(v, pattern) for k, v in m.items()} for m in messages]


def tokenize_rendered(text: str, tokenizer: Tokenizer) -> tuple[str, list[int]]:
    """(plain text, token ids) of a rendered prompt whose caller strings were escaped."""
    pattern = tokenizer.special_token_pattern
    if _MARK not in text or pattern is None:
        return text, tokenizer.encode(text, add_special_tokens=False)
    ids: list[int] = []
    plain: list[str] = []  # text since the last control token
    shown: list[str] = []
    scanner = re.compile(f"{_MARK}({_MARK}|{pattern.pattern})|({pattern.pattern})")
    pos = 0
    for m in scanner.finditer(text):
        gap = text[pos : m.start()].replace(_MARK, "")  # a lone mark a template cut off
        plain.append(gap)
        shown.append(gap)
        if m.group(1) is not None:  # the caller's: text
            plain.append(m.group(1))
            shown.append(m.group(1))
        else:  # the template's: a control token
            if any(plain):
                ids.extend(tokenizer.encode_as_text("".join(plain)))
            plain = []
            ids.append(tokenizer.special_tokens[m.group(2)])
            shown.append(m.group(2))
        pos = m.end()
    tail = text[pos:].replace(_MARK, "")
    plain.append(tail)
    shown.append(tail)
    if any(plain):
        ids.extend(tokenizer.encode_as_text("".join(plain)))
    return "".join(shown), ids


def template_variables(
    template: ChatTemplate, chat_template_kwargs: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The caller's extra template variables; ChatTemplateError naming any key that would
    replace one the renderer or the template environment sets itself."""
    if chat_template_kwargs is None:
        return {}
    if not isinstance(chat_template_kwargs, Mapping):
        raise ChatTemplateError("chat_template_kwargs: must be an object")
    kwargs = dict(chat_template_kwargs)
    bad = sorted(str(k) for k in kwargs if not isinstance(k, str))
    if bad:
        raise ChatTemplateError(f"chat_template_kwargs: keys must be strings, got {bad[0][:40]}")
    clash = sorted(template.reserved_variables & kwargs.keys())
    if clash:
        raise ChatTemplateError(
            f"chat_template_kwargs: {', '.join(clash)} cannot be set here (the server sets "
            "them from the request or the template defines them)"
        )
    return kwargs


def render_chat(
    template: ChatTemplate,
    tokenizer: Tokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    chat_template_kwargs: dict[str, Any] | None = None,
    special_tokens_in_content: bool = False,
) -> tuple[str, list[int]]:
    """Renders the conversation and tokenizes it; ChatTemplateError (a ValueError) for a
    conversation the template rejects."""
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError("messages: must be a non-empty list")
    kwargs = template_variables(template, chat_template_kwargs)
    pattern = tokenizer.special_token_pattern
    if not special_tokens_in_content and pattern is not None:
        messages = _escaped_messages(messages, pattern)
        tools = _escape(tools, pattern) if tools else tools
        kwargs = _escape(kwargs, pattern)
    text = template.render(messages, add_generation_prompt, tools, kwargs)
    if continue_final_message and messages[-1].get("role") == "assistant":
        # continue the assistant turn: cut the template's end-of-turn after its content
        last = messages[-1].get("content") or ""
        cut = text.rfind(last) if isinstance(last, str) else -1
        if cut != -1:
            text = text[: cut + len(last)]
    return tokenize_rendered(text, tokenizer)
