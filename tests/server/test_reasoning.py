"""Qwen3's reasoning and tool calls through a real server and the official openai client: the
<think> block comes back as `reasoning_content` beside `content`, whole and streamed, tool
calls parse after it, `enable_thinking: false` turns the thinking off in the prompt, and the
Qwen3 chat template renders as transformers' apply_chat_template (tools and reasoning)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.family_models import save_family_folder
from tests.server.conftest import start_server

TEMPLATE_DIR = Path(__file__).parent.parent / "data" / "chat_templates"
TEMPLATE = (TEMPLATE_DIR / "qwen3.jinja").read_text()
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
# what the model is made to write (a regex constraint: the random weights say nothing)
OUTPUT = f"<think>\nIt asks for the weather.\n</think>\n\n<tool_call>\n{CALL}\n</tool_call>"


def _regex(text: str) -> str:
    import re

    return re.escape(text)


@pytest.fixture(scope="module")
def qwen3_folder(tmp_path_factory) -> Path:
    return save_family_folder("qwen3", tmp_path_factory.mktemp("m") / "qwen3", TEMPLATE)


@pytest.fixture(scope="module")
def qwen3_server(qwen3_folder, tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("qwen3-server"), "--model", str(qwen3_folder))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(qwen3_server):
    from openai import OpenAI

    return OpenAI(base_url=qwen3_server.v1, api_key="unused", max_retries=0, timeout=120)


def _ask(client, stream: bool, text: str = OUTPUT, **extra):
    return client.chat.completions.create(
        model="qwen3",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=TOOLS,
        max_tokens=200,
        temperature=0,
        stream=stream,
        extra_body={"guided_regex": _regex(text), **extra},
    )


def test_reasoning_and_tool_call_whole(client):
    r = _ask(client, stream=False)
    message = r.choices[0].message
    assert message.reasoning_content == "\nIt asks for the weather.\n"
    assert message.content is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert r.choices[0].finish_reason == "tool_calls"


def test_reasoning_and_tool_call_streamed(client):
    reasoning, content, args, names = "", "", "", []
    for chunk in _ask(client, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning += getattr(delta, "reasoning_content", None) or ""
        content += delta.content or ""
        for call in delta.tool_calls or []:
            names += [call.function.name] if call.function.name else []
            args += call.function.arguments or ""
    assert reasoning == "\nIt asks for the weather.\n"
    assert content == ""
    assert names == ["get_weather"] and json.loads(args) == {"city": "Paris"}


def test_cut_inside_the_reasoning_the_content_is_null_whole_and_streamed(client):
    whole = _ask(client, False, "<think>\nA long thought that goes on.\n</think>\n\nHi.", max_tokens=6)
    assert whole.choices[0].finish_reason == "length"
    message = whole.choices[0].message
    assert message.content is None and message.reasoning_content
    contents, reasoning = [], ""
    stream = _ask(client, True, "<think>\nA long thought that goes on.\n</think>\n\nHi.", max_tokens=6)
    for chunk in stream:
        if chunk.choices:
            contents.append(chunk.choices[0].delta.content)
            reasoning += getattr(chunk.choices[0].delta, "reasoning_content", None) or ""
    assert not any(contents) and reasoning == message.reasoning_content


def test_thinking_switched_off(client):
    """enable_thinking false: the template closes an empty think block in the prompt, the
    output is all content."""
    r = _ask(client, False, "Sunny.", chat_template_kwargs={"enable_thinking": False})
    message = r.choices[0].message
    assert message.content == "Sunny." and message.reasoning_content is None


@pytest.mark.parametrize("thinking", [None, False])
def test_template_renders_as_transformers(qwen3_folder, thinking):
    """Tools, an assistant turn with reasoning and a tool call, a tool answer."""
    from transformers import AutoTokenizer

    from tokenmill.model.loader import load_model_files

    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "It asks for the weather.",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },  # fmt: skip
        {"role": "tool", "content": '{"sky": "clear"}'},
    ]
    variables = {} if thinking is None else {"enable_thinking": thinking}
    hf = AutoTokenizer.from_pretrained(str(qwen3_folder)).apply_chat_template(
        messages, tools=TOOLS, add_generation_prompt=True, tokenize=False, **variables
    )
    ours = load_model_files(str(qwen3_folder), with_weights=False).chat_template.render(
        messages, True, TOOLS, variables
    )
    assert ours == hf


# ------------------------------------------------------------------ GPT-OSS (harmony)

# GPT-OSS's published template (harmony: system and developer turns, tools as a namespace)
HARMONY_TEMPLATE = TEMPLATE_DIR.joinpath("gpt_oss.jinja").read_text()
HARMONY_CALL = (
    "<|channel|>analysis<|message|>Needs the weather tool.<|end|><|start|>assistant"
    '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": '
    '"Paris"}<|call|>'
)
HARMONY_ANSWER = (
    "<|channel|>analysis<|message|>Say hi.<|end|><|start|>assistant<|channel|>final"
    "<|message|>Hi there.<|return|>"
)


@pytest.fixture(scope="module")
def gpt_oss_client(tmp_path_factory):
    from openai import OpenAI

    folder = save_family_folder(
        "gpt_oss", tmp_path_factory.mktemp("m") / "gpt-oss", HARMONY_TEMPLATE
    )
    srv = start_server(tmp_path_factory.mktemp("gpt-oss-server"), "--model", str(folder))
    yield OpenAI(base_url=srv.v1, api_key="unused", max_retries=0, timeout=120)
    srv.stop()


def _ask_harmony(client, text: str, stream: bool):
    return client.chat.completions.create(
        model="gpt-oss",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=TOOLS,
        max_tokens=200,
        temperature=0,
        stream=stream,
        extra_body={"guided_regex": _regex(text)},
    )


def test_harmony_tool_call_and_answer_whole(gpt_oss_client):
    message = _ask_harmony(gpt_oss_client, HARMONY_CALL, False).choices[0].message
    assert message.reasoning_content == "Needs the weather tool."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    message = _ask_harmony(gpt_oss_client, HARMONY_ANSWER, False).choices[0].message
    assert (message.reasoning_content, message.content) == ("Say hi.", "Hi there.")
    assert not message.tool_calls


def test_harmony_streamed(gpt_oss_client):
    reasoning, args, names = "", "", []
    for chunk in _ask_harmony(gpt_oss_client, HARMONY_CALL, True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning += getattr(delta, "reasoning_content", None) or ""
        assert not delta.content
        for call in delta.tool_calls or []:
            names += [call.function.name] if call.function.name else []
            args += call.function.arguments or ""
    assert reasoning == "Needs the weather tool."
    assert names == ["get_weather"] and json.loads(args) == {"city": "Paris"}


def test_harmony_history_with_reasoning_and_effort(gpt_oss_client):
    """A conversation sent back with the earlier turn's reasoning, call and result, and
    reasoning_effort: the published template renders it and the answer still parses."""
    r = gpt_oss_client.chat.completions.create(
        model="gpt-oss",
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Needs the tool.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'},
        ],  # fmt: skip
        tools=TOOLS,
        max_tokens=200,
        temperature=0,
        reasoning_effort="high",
        extra_body={"guided_regex": _regex(HARMONY_ANSWER)},
    )
    message = r.choices[0].message
    assert (message.reasoning_content, message.content) == ("Say hi.", "Hi there.")
