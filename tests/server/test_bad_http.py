"""A real `tokenmill serve` answers what uvicorn's HTTP parser rejects itself (a Content-Length
that lies either way, a malformed request line or header) in the OpenAI error envelope, as
every other error; it used to be uvicorn's plain-text "Invalid HTTP request received.". The
request before the bad bytes is answered, and the server serves on."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.raw_http import exchange, lying_requests, parse_responses
from tests.server.conftest import free_port
from tests.server.test_hardening import assert_healthy

BODY = json.dumps({"prompt": "hi"}).encode()
CASES = lying_requests("/tokenize", BODY)


@pytest.mark.parametrize("case", CASES)
def test_bad_http_is_answered_in_the_envelope(server, case):
    data, half_close, statuses = CASES[case]
    url = urlsplit(server.base_url)
    responses = parse_responses(exchange(url.hostname, url.port, data, half_close))
    assert [r.status for r in responses] == statuses, responses
    for r in responses:
        assert r.headers["content-type"] == "application/json", r
    if statuses[0] == 200:  # /tokenize of the body before the extra bytes
        assert responses[0].json()["count"] > 0
    error = responses[-1].json()["error"]
    assert error["code"] == "bad_http_request" and error["type"] == "invalid_request_error"
    assert error["message"] and error["param"] is None


def test_the_server_serves_on(server):
    assert_healthy(server)


def wait_listening(proc: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            return
        except OSError:
            assert time.monotonic() < deadline, "the router did not start"
            time.sleep(0.2)


def test_the_router_answers_in_the_envelope_too(tmp_path):
    """`tokenmill router` builds its own uvicorn server (a replica that is down does not
    matter: uvicorn answers these before the app sees anything)."""
    port = free_port()
    cmd = [sys.executable, "-m", "tokenmill.cli", "router", "--port", str(port),
           "--replica", f"http://127.0.0.1:{free_port()}"]  # fmt: skip
    log = tmp_path / "router.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_listening(proc, port, log)
        for case in ("malformed-request-line", "body-cut-short"):
            data, half_close, _ = CASES[case]
            [r] = parse_responses(exchange("127.0.0.1", port, data, half_close))
            assert r.status == 400 and r.headers["content-type"] == "application/json"
            assert r.json()["error"]["code"] == "bad_http_request"
    finally:
        proc.terminate()
        proc.wait(30)
