"""chat_template_kwargs are template variables, never the renderer's own arguments: on every
path that renders a chat template (chat, /tokenize, Responses, batch lines) a key such as
`self` used to be a 500 (ChatTemplate.render() got multiple values for argument 'self'). A
key the server sets itself is a 400 naming it; anything else renders."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.server.conftest import MODEL
from tests.server.test_hardening import assert_400, assert_healthy, post

MESSAGES = [{"role": "user", "content": "hi"}]
BODIES = {
    "/v1/chat/completions": {"model": MODEL, "messages": MESSAGES, "max_tokens": 2},
    "/tokenize": {"model": MODEL, "messages": MESSAGES},
    "/v1/responses": {"model": MODEL, "input": "hi", "max_output_tokens": 2, "store": False},
}
# names of the renderer's parameters (old and new) and of jinja's own: plain variables
FREE = ["self", "variables", "template", "kwargs"]
# what the renderer or the template environment sets
RESERVED = ["messages", "tools", "add_generation_prompt", "bos_token", "raise_exception"]
NOT_AN_OBJECT = [5, "x", [1], True]


@pytest.mark.parametrize("path", BODIES)
def test_free_keys_render(server, path):
    r = post(server, path, {**BODIES[path], "chat_template_kwargs": {k: 1 for k in FREE}})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("key", RESERVED)
@pytest.mark.parametrize("path", BODIES)
def test_reserved_keys_are_400_naming_them(server, path, key):
    r = post(server, path, {**BODIES[path], "chat_template_kwargs": {key: 1}})
    assert_400(r, "chat_template_kwargs", key)


@pytest.mark.parametrize("value", NOT_AN_OBJECT, ids=str)
@pytest.mark.parametrize("path", BODIES)
def test_kwargs_that_are_not_an_object_are_400(server, path, value):
    assert_400(post(server, path, {**BODIES[path], "chat_template_kwargs": value}))


def test_batch_lines_answer_as_the_endpoint(server):
    """A hostile key in a batch line is that line's 200 or 400, never its 500."""
    chat = BODIES["/v1/chat/completions"]
    kwargs = {"free": {"self": 1}, "reserved": {"messages": []}, "not-an-object": 5}
    lines = [
        {"custom_id": name, "method": "POST", "url": "/v1/chat/completions",
         "body": {**chat, "chat_template_kwargs": value}}
        for name, value in kwargs.items()
    ]  # fmt: skip
    data = "\n".join(json.dumps(x) for x in lines).encode()
    up = httpx.post(
        f"{server.v1}/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"}
    )
    assert up.status_code == 200, up.text
    body = {"input_file_id": up.json()["id"], "endpoint": "/v1/chat/completions",
            "completion_window": "24h"}  # fmt: skip
    batch = httpx.post(f"{server.v1}/batches", json=body, timeout=30).json()
    deadline = time.monotonic() + 120
    while batch["status"] not in ("completed", "failed"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)
        batch = httpx.get(f"{server.v1}/batches/{batch['id']}", timeout=30).json()
    assert batch["status"] == "completed", batch
    status = {}
    for file_id in (batch["output_file_id"], batch["error_file_id"]):
        text = httpx.get(f"{server.v1}/files/{file_id}/content", timeout=30).text
        for raw in text.splitlines():
            out = json.loads(raw)
            status[out["custom_id"]] = out["response"]["status_code"]
            if out["response"]["status_code"] == 400:
                assert out["response"]["body"]["error"]["param"] == "chat_template_kwargs"
    assert status == {"free": 200, "reserved": 400, "not-an-object": 400}
    assert_healthy(server)
