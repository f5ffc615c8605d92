"""The OpenAI error envelope, {"error": {"message", "type", "param", "code"}}, and the error a
request body's own rules raise."""

from __future__ import annotations

from typing import Any

ERROR = "error"
INVALID_REQUEST = "invalid_request_error"


def error_body(
    message: str, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {ERROR: {"message": message, "type": type, "param": param, "code": code}}


class RequestError(ValueError):
    """A request its own fields make impossible (a 400): `param` names the field, `code` is
    OpenAI's error code (context_length_exceeded, ...). The server answers it as
    bad_request(message, param, code) (server/errors.py from_value_error)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
