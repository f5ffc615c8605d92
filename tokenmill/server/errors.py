"""The OpenAI error envelope, {"error": {"message", "type", "param", "code"}}
(tokenmill/openai/errors.py), as HTTP errors."""

from __future__ import annotations

import re
from typing import Any

from fastapi.responses import JSONResponse

from tokenmill.openai.errors import RequestError, error_body

__all__ = ["APIError", "bad_request", "error_body", "from_value_error"]


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


_FIELD_PREFIX = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*): ")


def from_value_error(err: ValueError, param_map: dict[str, str] | None = None) -> APIError:
    """Engine validation errors read "<field>: <reason>"; the field becomes `param`. A
    RequestError names its field and code itself."""
    if isinstance(err, RequestError):
        param = err.param
        return bad_request(err.message, (param_map or {}).get(param, param), err.code)
    message = str(err)
    match = _FIELD_PREFIX.match(message)
    param = match.group(1) if match else None
    if param and param_map:
        param = param_map.get(param, param)
    return bad_request(message, param)
