"""Each family's published chat template renders a chat request exactly as transformers'
apply_chat_template renders the same conversation: the server's own path (OpenAI request ->
template messages -> render) against transformers given the conversation as vLLM hands it to
a template (tool-call arguments parsed to objects, a missing content empty).

Templates that render no tools (Gemma 3, Phi-3, Phi-4) get tools through the server's
documented Hermes-style fallback instead, so only their tool-free conversations compare."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.tiny_models import embedded_tokenizer
from tokenmill.model.chat_template import ChatTemplate
from tokenmill.openai.protocol import ChatCompletionRequest
from tokenmill.server.chat_prompt import render_chat_request
from tokenmill.server.errors import APIError

DATA = Path(__file__).parents[1] / "data" / "chat_templates"

# template file -> (bos, eos, extra request fields to try besides none)
FAMILIES: dict[str, tuple[str | None, str, list[dict[str, Any]]]] = {
    "qwen3": (None, "<|im_end|>", [{"chat_template_kwargs": {"enable_thinking": False}}]),
    "gemma3": ("<bos>", "<eos>", []),
    "gemma3_pythonic": ("<bos>", "<eos>", []),
    "phi3": ("<s>", "<|endoftext|>", []),
    "phi4": ("<|endoftext|>", "<|im_end|>", []),
    "phi4_mini": ("<|endoftext|>", "<|endoftext|>", []),
    "phi4_mini_tools": ("<|endoftext|>", "<|endoftext|>", []),
    "gpt_oss": (
        "<|startoftext|>",
        "<|return|>",
        [
            {"reasoning_effort": "high"},
            {"chat_template_kwargs": {"reasoning_effort": "low", "model_identity": "You test."}},
        ],
    ),
}
NO_NATIVE_TOOLS = {"gemma3", "phi3", "phi4"}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "days": {"type": "integer"},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                },
                "required": ["city"],
            },
        },
    }
]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Zürich", "days": 2}'},
}
SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "Weather in Zürich? <b>now</b>"}
CALL_TURN = {"role": "assistant", "content": None, "tool_calls": [CALL]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear", "temp": 21}'}

# name -> (messages, tools)
CONVERSATIONS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = {
    "system_user": ([SYSTEM, USER], None),
    "multi_turn": (
        [USER, {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Sure?"}],
        None,
    ),
    "reasoning": (
        [USER, {"role": "assistant", "content": "Sunny.", "reasoning_content": "Easy one."}],
        None,
    ),
    "tools_given": ([SYSTEM, USER], TOOLS),
    "tool_call_and_result": ([SYSTEM, USER, CALL_TURN, RESULT], TOOLS),
    "reasoning_tool_call": (
        [
            USER,
            {**CALL_TURN, "reasoning_content": "Needs the tool."},
            RESULT,
            {"role": "assistant", "content": "Clear, 21."},
            {"role": "user", "content": "Thanks"},
        ],
        TOOLS,
    ),  # fmt: skip
}
TOOL_CONVERSATIONS = {"tools_given", "tool_call_and_result", "reasoning_tool_call"}


def _as_vllm_passes_them(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a template gets from vLLM: arguments parsed, no content -> empty content."""
    out = copy.deepcopy(messages)
    for m in out:
        for call in m.get("tool_calls") or []:
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        if m.get("content") is None:
            m["content"] = ""
    return out


def _transformers(name: str, messages, tools, generation_prompt: bool, fields) -> str:
    from jinja2 import TemplateError
    from transformers import PreTrainedTokenizerFast

    bos, eos, _ = FAMILIES[name]
    tok = PreTrainedTokenizerFast(
        tokenizer_object=embedded_tokenizer().hf, bos_token=bos, eos_token=eos
    )
    tok.chat_template = (DATA / f"{name}.jinja").read_text()
    kwargs = dict(fields.get("chat_template_kwargs") or {})
    if "reasoning_effort" in fields:
        kwargs.setdefault("reasoning_effort", fields["reasoning_effort"])
    try:
        return tok.apply_chat_template(
            _as_vllm_passes_them(messages), tools=tools, tokenize=False,
            add_generation_prompt=generation_prompt, **kwargs,
        )  # fmt: skip
    except TemplateError as e:
        return f"error: {e}"


def _tokenmill(name: str, messages, tools, generation_prompt: bool, fields) -> str:
    bos, eos, _ = FAMILIES[name]
    body = {"model": "m", "messages": messages, "add_generation_prompt": generation_prompt}
    body |= ({"tools": tools} if tools else {}) | fields
    template = ChatTemplate((DATA / f"{name}.jinja").read_text(), bos, eos)
    req = ChatCompletionRequest.model_validate(body)
    try:
        return render_chat_request(req, embedded_tokenizer(), template)[0]
    except APIError as e:
        return f"error: {e}"


def _cases():
    for name, (_, _, extra) in FAMILIES.items():
        for conversation in CONVERSATIONS:
            if name in NO_NATIVE_TOOLS and conversation in TOOL_CONVERSATIONS:
                continue
            for fields in [{}, *extra]:
                yield pytest.param(name, conversation, fields, id=f"{name}-{conversation}-{fields}")


@pytest.mark.parametrize("name,conversation,fields", list(_cases()))
def test_renders_as_transformers(name, conversation, fields):
    messages, tools = CONVERSATIONS[conversation]
    for generation_prompt in (True, False):
        theirs = _transformers(name, messages, tools, generation_prompt, fields)
        ours = _tokenmill(name, messages, tools, generation_prompt, fields)
        if theirs.startswith("error: "):  # the template refuses: a 400, not a prompt
            assert ours.startswith("error: "), (generation_prompt, ours)
        else:
            assert ours == theirs, generation_prompt


def test_families_without_tool_rendering_are_known():
    """The templates skipped for tool conversations are exactly those that render no tools."""
    for name in FAMILIES:
        source = (DATA / f"{name}.jinja").read_text()
        assert ChatTemplate(source).supports_tools is (name not in NO_NATIVE_TOOLS), name


def test_reasoning_effort_reaches_the_harmony_system_turn():
    messages, _ = CONVERSATIONS["system_user"]
    assert "Reasoning: medium" in _tokenmill("gpt_oss", messages, None, True, {})
    assert "Reasoning: high" in _tokenmill(
        "gpt_oss", messages, None, True, {"reasoning_effort": "high"}
    )


def test_generation_blocks_and_dict_render_as_transformers():
    """Template features transformers provides beyond plain jinja."""
    source = (
        "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}"
        "{{ dict(role=m.role) | tojson }}{% endfor %}"
    )
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=embedded_tokenizer().hf)
    tok.chat_template = source
    messages = [{"role": "user", "content": "hi"}]
    assert ChatTemplate(source).render(messages, False) == tok.apply_chat_template(
        messages, tokenize=False
    )
