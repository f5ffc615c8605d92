"""Gemma 3's pythonic and Phi-4-mini's functools[...] tool calls through a real server and the
official openai client, whole and streamed: the format is read from the chat template (vLLM's
tool templates for these models), and a list that does not parse comes back as content."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.family_models import save_family_folder
from tests.server.conftest import start_server
from tests.server.test_reasoning import TOOLS

DATA = Path(__file__).parents[1] / "data" / "chat_templates"
# family -> (model family, template file, an answer calling get_weather twice, a bad list)
FORMATS = {
    "gemma3": (
        "gemma3",
        "gemma3_pythonic",
        '[get_weather(city="Paris"), get_weather(city="Zürich")]',
        "[get_weather(city=Paris)]",
    ),
    "phi4_mini": (
        "phi3",
        "phi4_mini_tools",
        'functools[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_weather", "arguments": {"city": "Zürich"}}]',
        'functools[{"name": "get_weather", "arguments": {"city": "Paris"}',
    ),
}
EXPECTED = [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Zürich"})]


@pytest.fixture(scope="module", params=sorted(FORMATS))
def served(request, tmp_path_factory):
    from openai import OpenAI

    family, template, call, bad = FORMATS[request.param]
    text = (DATA / f"{template}.jinja").read_text()
    folder = save_family_folder(family, tmp_path_factory.mktemp(family) / "m", text)
    srv = start_server(tmp_path_factory.mktemp(f"{family}-server"), "--model", str(folder))
    yield OpenAI(base_url=srv.v1, api_key="unused", max_retries=0, timeout=120), call, bad
    srv.stop()


def _ask(client, text: str, stream: bool):
    return client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Weather in Paris and Zürich?"}],
        tools=TOOLS,
        max_tokens=120,
        temperature=0,
        stream=stream,
        extra_body={"guided_regex": re.escape(text)},
    )


def _streamed(client, text: str) -> tuple[str, dict[int, list]]:
    content, calls = "", {}
    for chunk in _ask(client, text, True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                name, args = calls.setdefault(call.index, ["", ""])
                calls[call.index] = [
                    name + (call.function.name or ""),
                    args + (call.function.arguments or ""),
                ]
    return content, calls


def test_calls_whole(served):
    client, call, _ = served
    r = _ask(client, call, False)
    message = r.choices[0].message
    assert message.content is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == (
        EXPECTED
    )
    assert len({c.id for c in message.tool_calls}) == 2
    assert r.choices[0].finish_reason == "tool_calls"


def test_calls_streamed(served):
    client, call, _ = served
    content, calls = _streamed(client, call)
    assert content == ""
    assert [(n, json.loads(a)) for n, a in (calls[i] for i in sorted(calls))] == EXPECTED


def test_a_list_that_does_not_parse_is_content(served):
    client, _, bad = served
    r = _ask(client, bad, False)
    assert r.choices[0].message.content == bad and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "stop"
    assert _streamed(client, bad) == (bad, {})


def test_plain_answer_is_content(served):
    client, _, _ = served
    assert _ask(client, "Sunny in both.", False).choices[0].message.content == "Sunny in both."
    assert _streamed(client, "Sunny in both.") == ("Sunny in both.", {})
