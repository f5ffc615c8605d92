"""Batch files, line by line: the input format (validated at upload and before an offline
run) and the output and error lines, in OpenAI's format."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenmill.server.errors import APIError, bad_request
from tokenmill.server.json_body import parse_json

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
MAX_CUSTOM_ID_CHARS = 512


@dataclass(frozen=True)
class InputLine:
    line: int  # 1-based line number in the file
    custom_id: str
    url: str
    body: dict[str, Any]


@dataclass(frozen=True)
class FileSummary:
    lines: int  # requests (blank lines are skipped)
    urls: tuple[str, ...]  # distinct endpoints, in first-seen order


def _invalid(line: int, message: str) -> APIError:
    return bad_request(f"line {line}: {message}", param="file", code="invalid_batch_line")


def parse_line(raw: bytes, line: int) -> InputLine:
    """One input line -> InputLine, or a 400 naming the line."""
    try:
        data = parse_json(raw)
    except APIError as e:
        raise _invalid(line, e.message.replace("the body ", "", 1)) from None
    if not isinstance(data, dict):
        raise _invalid(line, "must be a JSON object")
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise _invalid(line, "custom_id: must be a non-empty string")
    if len(custom_id) > MAX_CUSTOM_ID_CHARS:
        raise _invalid(line, f"custom_id: longer than {MAX_CUSTOM_ID_CHARS} characters")
    if data.get("method") != "POST":
        raise _invalid(line, 'method: must be "POST"')
    url = data.get("url")
    if url not in ENDPOINTS:
        raise _invalid(line, f"url: {str(url)[:80]!r} is not one of {', '.join(ENDPOINTS)}")
    if not isinstance(data.get("body"), dict):
        raise _invalid(line, "body: must be a JSON object")
    return InputLine(line, custom_id, url, data["body"])


def read_lines(path: str | Path, max_line_bytes: int) -> Iterator[InputLine]:
    """The file's requests in order (blank lines skipped), each validated; never holds more
    than one line (of at most max_line_bytes) in memory."""
    with open(path, "rb") as f:
        for number, raw in enumerate(iter(lambda: f.readline(max_line_bytes + 1), b""), 1):
            if len(raw.rstrip(b"\r\n")) > max_line_bytes:  # cut by readline: too long
                raise _invalid(number, f"longer than {max_line_bytes} bytes")
            if raw.strip():
                yield parse_line(raw, number)


def validate_file(path: str | Path, max_line_bytes: int, max_lines: int) -> FileSummary:
    """Every line checked (custom_id unique, at most max_lines requests); 400 at the first
    bad one."""
    seen: set[str] = set()
    urls: dict[str, None] = {}
    for item in read_lines(path, max_line_bytes):
        if item.custom_id in seen:
            raise _invalid(item.line, f"custom_id: {item.custom_id[:80]!r} is used twice")
        seen.add(item.custom_id)
        urls[item.url] = None
        if len(seen) > max_lines:
            raise _invalid(item.line, f"the file holds more than {max_lines} requests")
    if not seen:
        raise bad_request("file: holds no requests", param="file", code="invalid_batch_line")
    return FileSummary(len(seen), tuple(urls))


def new_line_id() -> str:
    return f"batch_req_{uuid.uuid4().hex}"


def result_line(
    custom_id: str, status_code: int, request_id: str, body: dict[str, Any]
) -> dict[str, Any]:
    """The line of a request that ran: its HTTP status and body (an error envelope when not
    200, echoed in `error`)."""
    error = None
    if status_code != 200:
        err = body.get("error") or {}
        error = {"code": err.get("code") or err.get("type"), "message": err.get("message")}
    return {
        "id": new_line_id(),
        "custom_id": custom_id,
        "response": {"status_code": status_code, "request_id": request_id, "body": body},
        "error": error,
    }


def error_line(custom_id: str, code: str, message: str) -> dict[str, Any]:
    """The line of a request that never ran (the batch expired)."""
    return {
        "id": new_line_id(),
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }


def dumps(line: dict[str, Any]) -> str:
    return json.dumps(line, ensure_ascii=False)
