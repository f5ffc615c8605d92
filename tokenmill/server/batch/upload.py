"""A multipart upload (`file` and `purpose`), streamed to disk as it arrives: the size cap
is enforced on the bytes received, so an oversized upload is refused without being kept
(in memory or on disk)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from fastapi import Request
from python_multipart.multipart import MultipartParseError, MultipartParser, parse_options_header

from tokenmill.server.errors import APIError, bad_request

MAX_FIELD_BYTES = 1024  # purpose and any other small field
MAX_FILENAME_CHARS = 255
_SLACK = 64 * 1024  # multipart framing around the file


def too_large(max_bytes: int) -> APIError:
    return APIError(
        413, f"file: larger than the limit of {max_bytes} bytes", "invalid_request_error",
        "file", "file_too_large",
    )  # fmt: skip


@dataclass
class Upload:
    path: Path  # a temporary file in the files directory
    filename: str = ""
    purpose: str | None = None
    size: int = 0
    has_file: bool = False


@dataclass
class _Parts:
    """The multipart callbacks: the file part goes to disk, small fields to memory."""

    upload: Upload
    max_bytes: int
    out: IO[bytes] | None = None
    headers: dict[bytes, bytes] = field(default_factory=dict)
    header_field: bytes = b""
    header_value: bytes = b""
    name: bytes = b""
    value: bytearray = field(default_factory=bytearray)
    in_file: bool = False

    def on_part_begin(self) -> None:
        self.headers, self.value, self.in_file = {}, bytearray(), False

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self.header_field += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self.header_value += data[start:end]

    def on_header_end(self) -> None:
        self.headers[self.header_field.lower()] = self.header_value
        self.header_field, self.header_value = b"", b""

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self.headers.get(b"content-disposition", b""))
        self.name = options.get(b"name", b"")
        if self.name == b"file" and b"filename" in options:
            if self.upload.has_file:
                raise bad_request("file: give one file", param="file")
            self.upload.has_file = self.in_file = True
            name = options[b"filename"].decode("utf-8", "replace")
            self.upload.filename = os.path.basename(name.replace("\\", "/"))[:MAX_FILENAME_CHARS]
            self.out = open(self.upload.path, "wb")  # noqa: SIM115  (closed in receive_upload)

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self.in_file:
            self.upload.size += end - start
            if self.upload.size > self.max_bytes:
                raise too_large(self.max_bytes)
            assert self.out is not None
            self.out.write(data[start:end])
        else:
            self.value += data[start:end]
            if len(self.value) > MAX_FIELD_BYTES:
                raise bad_request(f"{self.name.decode(errors='replace')[:40]}: field too long")

    def on_part_end(self) -> None:
        if self.name == b"purpose" and not self.in_file:
            self.upload.purpose = self.value.decode("utf-8", "replace")


async def receive_upload(request: Request, path: Path, max_bytes: int) -> Upload:
    """The upload, its file written to `path` (removed again on any error)."""
    ctype, options = parse_options_header(request.headers.get("content-type"))
    boundary = options.get(b"boundary")
    if ctype != b"multipart/form-data" or not boundary:
        raise APIError(
            415, "Content-Type must be multipart/form-data (fields `file` and `purpose`)",
            "invalid_request_error",
        )  # fmt: skip
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > max_bytes + _SLACK:
        raise too_large(max_bytes)
    upload = Upload(path)
    parts = _Parts(upload, max_bytes)
    callbacks = {
        name: getattr(parts, name)
        for name in (
            "on_part_begin", "on_header_field", "on_header_value", "on_header_end",
            "on_headers_finished", "on_part_data", "on_part_end",
        )
    }  # fmt: skip
    parser = MultipartParser(boundary, callbacks)  # type: ignore[arg-type]
    try:
        async for chunk in request.stream():
            parser.write(chunk)
        parser.finalize()
    except MultipartParseError as e:
        _discard(parts, path)
        raise bad_request(f"the multipart body is malformed: {e}") from None
    except BaseException:
        _discard(parts, path)
        raise
    if parts.out is not None:
        parts.out.close()
    if not upload.has_file:
        raise bad_request("file: is required (a multipart file field)", param="file")
    return upload


def _discard(parts: _Parts, path: Path) -> None:
    if parts.out is not None:
        parts.out.close()
    path.unlink(missing_ok=True)
