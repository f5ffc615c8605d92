"""uvicorn's own 400s (what its HTTP parser rejects, a body cut short) come in the OpenAI
error envelope with either of its HTTP/1.1 protocols, and the request before bad bytes is
answered first; a tiny app in-process stands in for the server (tests/server/test_bad_http.py
sends the same bytes to a real `tokenmill serve`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from tests.raw_http import exchange, lying_requests, parse_responses
from tests.server.conftest import free_port
from tokenmill.server.http_protocol import CODE, EnvelopeH11Protocol, envelope_protocol

BODY = b'{"x": 1}'
seen: list[bytes | str] = []  # what the app read: a body, or "disconnect"


async def app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            seen.append("disconnect")
            return
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    seen.append(body)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"12")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b'{"ok": true}'})


@pytest.fixture(scope="module", params=["h11", "auto"])
def port(request) -> Iterator[int]:
    protocol = EnvelopeH11Protocol if request.param == "h11" else envelope_protocol()
    port = free_port()
    config = uvicorn.Config(app, port=port, log_level="error", lifespan="off", http=protocol)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    yield port
    server.should_exit = True
    thread.join(10)


CASES = lying_requests("/x", BODY)


@pytest.mark.parametrize("case", CASES)
def test_rejections_are_in_the_envelope(port, case):
    data, half_close, statuses = CASES[case]
    seen.clear()
    responses = parse_responses(exchange("127.0.0.1", port, data, half_close))
    assert [r.status for r in responses] == statuses
    last = responses[-1]
    assert last.headers["content-type"] == "application/json"
    assert last.headers["connection"] == "close"
    error = last.json()["error"]
    assert error["code"] == CODE and error["type"] == "invalid_request_error" and error["message"]
    assert set(error) == {"message", "type", "param", "code"}
    if statuses[0] == 200:  # the request before the bad bytes got its answer and its body
        assert responses[0].json() == {"ok": True} and seen == [BODY]


def test_a_body_cut_short_never_reaches_the_app_as_complete(port):
    data, _, _ = CASES["body-cut-short"]
    seen.clear()
    exchange("127.0.0.1", port, data, half_close=True)
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        time.sleep(0.02)
    assert seen == ["disconnect"]


def test_the_server_keeps_serving(port):
    for case in CASES:
        data, half_close, _ = CASES[case]
        exchange("127.0.0.1", port, data, half_close)
    good = b"POST /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 8\r\n\r\n" + BODY
    assert [r.status for r in parse_responses(exchange("127.0.0.1", port, good))] == [200]
