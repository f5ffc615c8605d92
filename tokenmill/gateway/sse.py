"""Server-sent events as the OpenAI API sends them: `data: <json>` blocks ended by a blank
line (Responses events also carry an `event:` line), `data: [DONE]` at the end."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenmill.gateway.jsonio import dumps, loads

MAX_EVENT_BYTES = 16 * 1024 * 1024


@dataclass
class Event:
    data: Any  # the parsed JSON, or the raw text when it is not JSON ("[DONE]")
    name: str | None = None

    def encode(self) -> bytes:
        text = self.data.encode() if isinstance(self.data, str) else dumps(self.data)
        head = f"event: {self.name}\n".encode() if self.name else b""
        return head + b"data: " + text + b"\n\n"


class SSEParser:
    """Bytes in any chunking -> complete events."""

    def __init__(self) -> None:
        self.buffer = b""

    def feed(self, chunk: bytes) -> list[Event]:
        self.buffer += chunk.replace(b"\r\n", b"\n")
        if len(self.buffer) > MAX_EVENT_BYTES and b"\n\n" not in self.buffer:
            raise ValueError("server-sent event too large")
        events = []
        while True:
            block, sep, rest = self.buffer.partition(b"\n\n")
            if not sep:
                break
            self.buffer = rest
            event = parse_block(block)
            if event is not None:
                events.append(event)
        return events

    def rest(self) -> list[Event]:
        block, self.buffer = self.buffer, b""
        event = parse_block(block) if block.strip() else None
        return [event] if event is not None else []


def parse_block(block: bytes) -> Event | None:
    name, data = None, []
    for line in block.decode("utf-8", "replace").split("\n"):
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif line.startswith("event:"):
            name = line[6:].strip()
    if not data:
        return None
    text = "\n".join(data)
    try:
        return Event(loads(text), name)
    except ValueError:
        return Event(text, name)
