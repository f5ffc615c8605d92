"""The OpenAI Agents SDK (chat-completions model) running a tool-calling agent on a live server."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

import pytest
from pydantic import Field

from tests.compat.common import MODEL, SKIP_REASON, check_args

agents = pytest.importorskip("agents", reason=SKIP_REASON)


def make_agent(server, calls: list[dict], **settings) -> agents.Agent:
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)  # no internet: never export traces

    @agents.function_tool
    def get_weather(
        city: Annotated[str, Field(max_length=40)], unit: Literal["celsius", "fahrenheit"]
    ) -> str:
        """Current weather for a city.

        Args:
            city: The city's name.
            unit: Temperature unit.
        """
        calls.append({"city": city, "unit": unit})
        return f"21 degrees {unit} in {city}"

    client = AsyncOpenAI(base_url=server.v1, api_key="x", max_retries=0, timeout=300)
    model = agents.OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
    return agents.Agent(
        name="weather",
        instructions="You answer weather questions by calling get_weather.",
        model=model,
        tools=[get_weather],
        model_settings=agents.ModelSettings(
            **{"tool_choice": "required", "temperature": 0, "max_tokens": 120, **settings}
        ),
        tool_use_behavior="stop_on_first_tool",
    )


async def run_streamed(agent, prompt: str):
    result = agents.Runner.run_streamed(agent, prompt)
    async for _ in result.stream_events():
        pass
    return result


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_streamed"])
def test_agent_calls_tool_with_valid_arguments(compat_server, stream):
    calls: list[dict] = []
    agent = make_agent(compat_server, calls)
    ask = "What is the weather in Paris, in celsius?"
    run = run_streamed(agent, ask) if stream else agents.Runner.run(agent, ask)
    result = asyncio.run(run)
    assert len(calls) >= 1, "the agent never called its tool"
    tool = agent.tools[0]
    args = check_args(calls[0], tool.params_json_schema)
    assert result.final_output == f"21 degrees {args['unit']} in {args['city']}"
    items = [i for i in result.new_items if i.type == "tool_call_item"]
    assert items and items[0].raw_item.name == "get_weather"


def test_bad_request_raises_openai_bad_request(compat_server):
    import openai

    agent = make_agent(compat_server, [], max_tokens=-1)
    with pytest.raises(openai.BadRequestError) as err:
        asyncio.run(agents.Runner.run(agent, "Hello"))
    assert err.value.status_code == 400
