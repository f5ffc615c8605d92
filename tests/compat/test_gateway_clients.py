"""Third-party clients, unmodified, through the gateway: langchain's ChatOpenAI and litellm with
gateway keys; a tool policy's decisions reach them as ordinary messages (an allowed call,
streamed whole; a refused one, a refusal in the content), and usage is metered for each."""

from __future__ import annotations

import hashlib

import httpx
import pytest
import yaml

from tests.compat.common import MODEL, SKIP_REASON, WEATHER_TOOL, check_args
from tests.server.conftest import start_server

pytest.importorskip("langchain_openai", reason=SKIP_REASON)
litellm = pytest.importorskip("litellm", reason=SKIP_REASON)
pytestmark = pytest.mark.filterwarnings("ignore:Items? .*ReadOnly:UserWarning")

ADMIN = "admin-compat-" + "c" * 32
REFUSAL = "Tool call refused by policy."


@pytest.fixture(scope="module")
def gateway_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gateway-compat")
    config = {
        "database": str(tmp / "gw.sqlite3"),
        "journal": str(tmp / "journal"),
        "admin_key_sha256": hashlib.sha256(ADMIN.encode()).hexdigest(),
        "prices": {"default": {"input": 1.0, "output": 2.0}},
        "guardrails": {"rules": [{"name": "pii", "scanner": "pii", "action": "redact"}]},
        "tool_policies": {
            "weather-only": {"allow": ["get_weather"], "refusal": REFUSAL},
            "nothing": {"allow": [], "refusal": REFUSAL},
        },
    }
    (tmp / "gw.yaml").write_text(yaml.safe_dump(config))
    srv = start_server(tmp, "--gateway-config", str(tmp / "gw.yaml"))
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


def new_key(server, **fields) -> tuple[str, str]:
    reply = httpx.post(f"{server.base_url}/admin/keys", json=fields,
                       headers={"Authorization": f"Bearer {ADMIN}"})  # fmt: skip
    assert reply.status_code == 201, reply.text
    return reply.json()["key"], reply.json()["id"]


def usage_of(server, key: str) -> dict:
    reply = httpx.get(f"{server.base_url}/v1/usage", params={"group_by": "key"},
                      headers={"Authorization": f"Bearer {key}"})  # fmt: skip
    return reply.json()["data"][0]


@pytest.mark.parametrize("stream", [False, True], ids=["invoke", "stream"])
def test_langchain_tool_policy(gateway_server, stream):
    from langchain_openai import ChatOpenAI

    ask = "What is the weather in Paris, in celsius?"
    for policy, allowed in (("weather-only", True), ("nothing", False)):
        key, _ = new_key(gateway_server, tool_policy=policy)
        llm = ChatOpenAI(base_url=gateway_server.v1, api_key=key, model=MODEL, max_retries=0,
                         temperature=0, max_tokens=120, timeout=300)  # fmt: skip
        llm = llm.bind_tools([WEATHER_TOOL], tool_choice="get_weather")
        if stream:
            chunks = list(llm.stream(ask))
            msg = sum(chunks[1:], chunks[0])
        else:
            msg = llm.invoke(ask)
        assert not msg.invalid_tool_calls, msg.invalid_tool_calls
        if allowed:
            assert [c["name"] for c in msg.tool_calls] == ["get_weather"]
            check_args(msg.tool_calls[0]["args"], WEATHER_TOOL["function"]["parameters"])
        else:
            assert msg.tool_calls == [] and msg.content.endswith(REFUSAL)
        assert usage_of(gateway_server, key)["requests"] == 1


def test_litellm_through_the_gateway(gateway_server):
    key, _ = new_key(gateway_server, rpm=100)
    args = dict(model=f"openai/{MODEL}", api_base=gateway_server.v1, api_key=key, num_retries=0,
                temperature=0, max_tokens=24, timeout=300,
                messages=[{"role": "user", "content": "Name three primary colors."}])  # fmt: skip
    full = litellm.completion(**args)
    chunks = list(litellm.completion(stream=True, **args))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    usage = usage_of(gateway_server, key)
    assert usage["requests"] == 2 and usage["completion_tokens"] == 2 * full.usage.completion_tokens
    with pytest.raises(litellm.AuthenticationError):
        litellm.completion(**{**args, "api_key": "tm-wrong"})
