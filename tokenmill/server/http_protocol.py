"""uvicorn's HTTP/1.1 protocols, answering what they reject themselves in the OpenAI error
envelope (JSON, code bad_http_request) as every other error is answered, not with uvicorn's
plain-text "Invalid HTTP request received.": a malformed request line or header, a body
longer than its Content-Length (the rest is no request), a body cut short by the client
ending its side of the connection. A request before the bad bytes is answered first."""

from __future__ import annotations

import asyncio
import json
from functools import cache
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from tokenmill.server.errors import error_body

CODE = "bad_http_request"
MALFORMED = (
    "the request is not valid HTTP/1.1 (its request line, a header, or bytes past the body "
    "its Content-Length announced)"
)
CUT_SHORT = "the client ended the connection before the request body its headers announced"


def error_bytes(message: str, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """A whole 400 response (the connection closes after it)."""
    body = json.dumps(error_body(message, "invalid_request_error", None, CODE)).encode()
    head = [b"HTTP/1.1 400 Bad Request\r\n"]
    for name, value in default_headers:
        head += [name, b": ", value, b"\r\n"]
    head += [
        b"content-type: application/json\r\n",
        b"content-length: %d\r\n" % len(body),
        b"connection: close\r\n\r\n",
    ]
    return b"".join(head) + body


class EnvelopeErrors:
    """Mixed into a uvicorn protocol class (it has transport, cycle, server_state)."""

    transport: asyncio.Transport
    cycle: Any
    server_state: Any
    _held: bytes | None = None  # a 400 waiting for the request before it to be answered

    def send_400_response(self, msg: str) -> None:  # uvicorn's hook for what it rejects
        self._reject(MALFORMED)

    def eof_received(self) -> bool | None:
        cycle = self.cycle
        if (
            cycle is not None
            and cycle.more_body
            and not cycle.response_started
            and not cycle.disconnected
        ):
            cycle.disconnected = True  # the app reading the body stops (it answers nobody)
            cycle.message_event.set()
            self._reject(CUT_SHORT)
        return None  # the connection closes (after what was written)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if self._held is not None and not self._answering():
            self._write_and_close(self._held)

    def _answering(self) -> bool:
        cycle = self.cycle
        return cycle is not None and not cycle.response_complete and not cycle.disconnected

    def _reject(self, message: str) -> None:
        data = error_bytes(message, self.server_state.default_headers)
        if self._answering():
            self._held = data
        else:
            self._write_and_close(data)

    def _write_and_close(self, data: bytes) -> None:
        self._held = None
        if not self.transport.is_closing():
            self.transport.write(data)
            self.transport.close()


class EnvelopeH11Protocol(EnvelopeErrors, H11Protocol):
    pass


@cache
def envelope_protocol() -> type[asyncio.Protocol]:
    """The protocol class for uvicorn.Config(http=...): uvicorn's own choice (httptools
    when installed, else h11) with errors in the envelope."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools is optional
        return EnvelopeH11Protocol

    class EnvelopeHttpToolsProtocol(EnvelopeErrors, HttpToolsProtocol):
        pass

    return EnvelopeHttpToolsProtocol
