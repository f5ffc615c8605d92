"""The OpenAI Agents SDK running a tool-calling agent on a live server: with its default model
class (OpenAIResponsesModel, /v1/responses) and with the chat-completions one."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

import pytest
from pydantic import Field

from tests.compat.common import MODEL, SKIP_REASON, check_args

agents = pytest.importorskip("agents", reason=SKIP_REASON)


def weather_tool(calls: list[dict]) -> agents.FunctionTool:
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

    return get_weather


def make_agent(server, calls: list[dict], **settings) -> agents.Agent:
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)  # no internet: never export traces
    get_weather = weather_tool(calls)
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


# ---------------------------------------------------------------- the default: Responses


def responses_run_config(server) -> agents.RunConfig:
    """The SDK's default provider and model class, pointed at the server."""
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=server.v1, api_key="x", max_retries=0, timeout=300)
    provider = agents.OpenAIProvider(openai_client=client)
    assert isinstance(provider.get_model(MODEL), agents.OpenAIResponsesModel)
    return agents.RunConfig(model_provider=provider, tracing_disabled=True)


def responses_agent(calls: list[dict], **kwargs) -> agents.Agent:
    return agents.Agent(
        name="weather",
        instructions="You answer weather questions by calling get_weather.",
        model=MODEL,
        tools=[weather_tool(calls)],
        model_settings=agents.ModelSettings(tool_choice="required", temperature=0, max_tokens=60),
        **kwargs,
    )


ASK = "What is the weather in Paris, in celsius?"


def test_default_responses_model_calls_tool(compat_server):
    calls: list[dict] = []
    agent = responses_agent(calls, tool_use_behavior="stop_on_first_tool")
    config = responses_run_config(compat_server)
    result = asyncio.run(agents.Runner.run(agent, ASK, run_config=config))
    args = check_args(calls[0], agent.tools[0].params_json_schema)
    assert result.final_output == f"21 degrees {args['unit']} in {args['city']}"
    assert result.raw_responses[0].response_id.startswith("resp_")


def test_default_responses_model_streams_the_whole_tool_loop(compat_server):
    """Streamed, the whole loop on /v1/responses: the forced call, the tool's result sent back
    as a function_call_output item, then the model's answer (tool_choice resets to auto)."""
    calls: list[dict] = []
    agent = responses_agent(calls)
    config = responses_run_config(compat_server)

    async def run():
        result = agents.Runner.run_streamed(agent, ASK, run_config=config, max_turns=4)
        async for _ in result.stream_events():
            pass
        return result

    result = asyncio.run(run())
    assert len(calls) >= 1, "the agent never called its tool"
    check_args(calls[0], agent.tools[0].params_json_schema)
    kinds = [i.type for i in result.new_items]
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"], kinds
    assert kinds[-1] == "message_output_item", kinds
    assert isinstance(result.final_output, str)
    responses = result.raw_responses
    assert len(responses) >= 2 and all(r.response_id.startswith("resp_") for r in responses)
