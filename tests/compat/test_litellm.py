"""litellm's OpenAI-compatible provider (`openai/<model>` + api_base) against a live server."""

from __future__ import annotations

import json

import pytest

from tests.compat.common import MODEL, SKIP_REASON, WEATHER_TOOL, check_args

litellm = pytest.importorskip("litellm", reason=SKIP_REASON)
# litellm's own pydantic models warn about ReadOnly TypedDict items when first built.
pytestmark = pytest.mark.filterwarnings("ignore:Items? .*ReadOnly:UserWarning")

MESSAGES = [{"role": "user", "content": "Name three primary colors."}]
ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


def complete(server, **kwargs):
    kwargs = {"temperature": 0, "max_tokens": 24, "messages": MESSAGES, **kwargs}
    return litellm.completion(
        model=f"openai/{MODEL}",
        api_base=server.v1,
        api_key="x",
        num_retries=0,
        timeout=300,
        **kwargs,
    )


def test_streamed_completion_reassembles(compat_server):
    full = complete(compat_server)
    text = full.choices[0].message.content
    assert text and text.strip()
    assert full.choices[0].finish_reason in ("stop", "length")
    assert 0 < full.usage.completion_tokens <= 24

    chunks = list(complete(compat_server, stream=True))
    assert len(chunks) > 2, "streaming returned the answer in one piece"
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(pieces) == text
    rebuilt = litellm.stream_chunk_builder(chunks, messages=MESSAGES)
    assert rebuilt.choices[0].message.content == text
    assert rebuilt.choices[0].finish_reason == full.choices[0].finish_reason


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
def test_required_tool_call_is_parsed(compat_server, stream):
    kwargs = dict(messages=ASK, tools=[WEATHER_TOOL], tool_choice="required", max_tokens=120)
    if stream:
        chunks = list(complete(compat_server, stream=True, **kwargs))
        resp = litellm.stream_chunk_builder(chunks, messages=ASK)
    else:
        resp = complete(compat_server, **kwargs)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert calls, choice.message
    assert calls[0].function.name == "get_weather"
    assert calls[0].id
    args = check_args(calls[0].function.arguments)
    assert json.loads(calls[0].function.arguments) == args


def test_bad_request_raises_bad_request_error(compat_server):
    with pytest.raises(litellm.BadRequestError) as err:
        complete(compat_server, max_tokens=-1)
    assert err.value.status_code == 400
    assert "max_tokens" in str(err.value)
