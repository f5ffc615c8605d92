"""Raw HTTP/1.1 over a socket, for requests no client library would send (a Content-Length
that lies, a malformed request line) and the responses that come back."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from typing import Any


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def exchange(
    host: str, port: int, data: bytes, half_close: bool = False, timeout: float = 10
) -> bytes:
    """Sends `data` (then ends our side, if asked) and reads until the server closes; a
    server that keeps the connection open past `timeout` is a test failure."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def parse_responses(raw: bytes) -> list[RawResponse]:
    """The responses in `raw`, in order (each framed by its Content-Length)."""
    out = []
    while raw:
        head, sep, rest = raw.partition(b"\r\n\r\n")
        assert sep, f"a response without the end of its headers: {raw[:200]!r}"
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers["content-length"])
        out.append(RawResponse(status, headers, rest[:length]))
        raw = rest[length:]
    return out


def lying_requests(path: str, body: bytes) -> dict[str, tuple[bytes, bool, list[int]]]:
    """name -> (bytes, end our side after them, the statuses that must come back), for a
    POST of `body` to `path` that is answered 200 when sent properly."""
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
    declared = b"Content-Length: %d\r\n\r\n"
    return {
        "body-cut-short": (head + declared % (len(body) + 90) + body, True, [400]),
        "body-longer-than-declared": (
            head + declared % len(body) + body + b"xx yy\r\n\r\n",
            False,
            [200, 400],
        ),
        "malformed-request-line": (b"GARBAGE\r\n\r\n", False, [400]),
        "header-without-colon": (b"GET / HTTP/1.1\r\nHost: x\r\nno colon\r\n\r\n", False, [400]),
        "content-length-not-a-number": (head + b"Content-Length: ten\r\n\r\n" + body, False, [400]),
        "two-content-lengths": (
            head + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
            False,
            [400],
        ),
    }
