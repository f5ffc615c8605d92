"""langchain-openai's ChatOpenAI, unmodified, pointed at a live server."""

from __future__ import annotations

import re
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from tests.compat.common import MODEL, SKIP_REASON, check_args

pytest.importorskip("langchain_openai", reason=SKIP_REASON)

PROMPT = "Name three primary colors."


class City(BaseModel):
    """Facts about a city."""

    name: str = Field(max_length=40)
    country: str = Field(max_length=40)
    population_millions: int = Field(ge=0, le=100)


class GetWeather(BaseModel):
    """Current weather for a city."""

    model_config = ConfigDict(extra="forbid")  # the schema sent says additionalProperties: false

    city: str = Field(max_length=40)
    unit: Literal["celsius", "fahrenheit"]


def chat(server, **kwargs):
    from langchain_openai import ChatOpenAI

    kwargs = {"temperature": 0, "max_tokens": 24, **kwargs}
    return ChatOpenAI(
        base_url=server.v1, api_key="x", model=MODEL, max_retries=0, timeout=300, **kwargs
    )


def test_invoke_and_stream_agree(compat_server):
    from langchain_core.messages import AIMessage

    llm = chat(compat_server)
    msg = llm.invoke(PROMPT)
    assert isinstance(msg, AIMessage) and msg.content.strip()
    assert msg.response_metadata["finish_reason"] in ("stop", "length")
    assert msg.response_metadata["model_name"] == MODEL
    assert msg.usage_metadata["input_tokens"] > 0
    assert 0 < msg.usage_metadata["output_tokens"] <= 24

    chunks = list(llm.stream(PROMPT))
    assert len(chunks) > 2, "streaming returned the answer in one piece"
    assert "".join(c.content for c in chunks) == msg.content
    whole = sum(chunks[1:], chunks[0])
    assert whole.response_metadata.get("finish_reason") == msg.response_metadata["finish_reason"]


def test_structured_output_json_schema(compat_server):
    llm = chat(compat_server, max_tokens=120)
    structured = llm.with_structured_output(City, method="json_schema", include_raw=True)
    out = structured.invoke("Give the name, country and population of Paris.")
    assert out["parsing_error"] is None, out["raw"]
    assert isinstance(out["parsed"], City)


@pytest.mark.parametrize("stream", [False, True], ids=["invoke", "stream"])
@pytest.mark.parametrize("tool_choice", ["GetWeather", "required"])
def test_forced_tool_call_is_parsed(compat_server, tool_choice, stream):
    from langchain_core.utils.function_calling import convert_to_openai_tool

    schema = convert_to_openai_tool(GetWeather)["function"]["parameters"]
    assert schema.get("additionalProperties") is False
    llm = chat(compat_server, max_tokens=120).bind_tools([GetWeather], tool_choice=tool_choice)
    ask = "What is the weather in Paris, in celsius?"
    if stream:
        chunks = list(llm.stream(ask))
        msg = sum(chunks[1:], chunks[0])
    else:
        msg = llm.invoke(ask)
    assert not msg.invalid_tool_calls, msg.invalid_tool_calls
    assert len(msg.tool_calls) >= 1, msg
    call = msg.tool_calls[0]
    assert call["name"] == "GetWeather"
    assert call["id"]
    check_args(call["args"], schema)
    GetWeather.model_validate(call["args"])


def test_bad_request_raises_openai_bad_request(compat_server):
    import openai

    with pytest.raises(openai.BadRequestError) as err:
        chat(compat_server, max_tokens=-1).invoke(PROMPT)
    assert err.value.status_code == 400
    assert re.search(r"max_(completion_)?tokens", str(err.value))
