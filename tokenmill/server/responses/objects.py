"""The `response` object as OpenAI returns it (and the official client's `Response` model
parses): the request's settings echoed, status, output items, usage, error."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tokenmill.openai import responses_objects as ro
from tokenmill.openai.responses_protocol import FunctionToolChoice, ResponsesRequest

Status = str  # queued | in_progress | completed | incomplete | failed | cancelled


def usage(input_tokens: int, output_tokens: int, cached_tokens: int) -> dict[str, Any]:
    # cache writes are not measured (prefix caching stores every full block it computes)
    return ro.usage(input_tokens, output_tokens, cached_tokens, cache_write_tokens=0)


def _text_config(req: ResponsesRequest) -> dict[str, Any]:
    fmt = req.text.format if req.text is not None else None
    if fmt is None:
        return {"format": {"type": "text"}}
    out: dict[str, Any] = {"format": fmt.model_dump(by_alias=True, exclude_none=True)}
    if req.text.verbosity is not None:
        out["verbosity"] = req.text.verbosity
    return out


def _tool_choice(req: ResponsesRequest) -> Any:
    choice = req.tool_choice
    if isinstance(choice, FunctionToolChoice):
        return {"type": "function", "name": choice.name}
    return choice or "auto"


def echo(req: ResponsesRequest, model: str) -> dict[str, Any]:
    """The request's settings, as every response object repeats them."""
    return ro.settings(
        model,
        instructions=req.instructions,
        max_output_tokens=req.max_output_tokens,
        previous_response_id=req.previous_response_id,
        tools=[t.model_dump(exclude_none=True) for t in req.tools or []],
        tool_choice=_tool_choice(req),
        parallel_tool_calls=req.parallel_tool_calls is not False,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        text=_text_config(req),
        truncation=req.truncation,
        metadata=req.metadata,
        user=req.user,
        background=req.background,
        reasoning={"effort": None, "summary": None},
        service_tier="default",
    )


@dataclass
class ResponseObject:
    """One response's object, updated as it runs."""

    id: str
    settings: dict[str, Any]
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: Status = "in_progress"
    output: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    incomplete_reason: str | None = None
    completed_at: int | None = None

    def finish(self, status: Status, output: list[dict[str, Any]], usage_: dict | None) -> None:
        self.status, self.output, self.usage = status, output, usage_
        if status == "incomplete":
            self.incomplete_reason = "max_output_tokens"
        if status == "completed":
            self.completed_at = int(time.time())

    def fail(self, code: str, message: str) -> None:
        self.status = "failed"
        self.error = {"code": code, "message": message}

    def to_dict(self) -> dict[str, Any]:
        reason = self.incomplete_reason
        return ro.response_object(
            self.id,
            self.created_at,
            self.status,
            self.settings,
            self.output,
            self.usage,
            completed_at=self.completed_at,
            error=self.error,
            incomplete_details={"reason": reason} if reason else None,
        )
