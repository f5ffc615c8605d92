"""State shared by the endpoint adapters: one request's context and the per-text output
filter (guardrails on a choice's text, streamed or whole)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tokenmill.gateway.guardrails import (
    Decision,
    GuardrailsConfig,
    OutputChecker,
    check_output_async,
)
from tokenmill.gateway.tool_policy import ToolPolicy, check_tool_call
from tokenmill.openai.completion_objects import CONTENT, TEXT
from tokenmill.openai.errors import INVALID_REQUEST, error_body


@dataclass
class TextRef:
    """A user-controlled string inside a request body: parent[key]."""

    parent: Any
    key: Any

    @property
    def text(self) -> str:
        return self.parent[self.key]

    def set(self, text: str) -> None:
        self.parent[self.key] = text


def content_refs(item: dict[str, Any]) -> list[TextRef]:
    """The text of a message's `content`: a string, or the `text` of each part."""
    content = item.get(CONTENT)
    if isinstance(content, str):
        return [TextRef(item, CONTENT)]
    if not isinstance(content, list):
        return []
    return [
        TextRef(part, TEXT)
        for part in content
        if isinstance(part, dict) and isinstance(part.get("text"), str)
    ]


@dataclass
class ToolCallRecord:
    name: str
    arguments: str
    allowed: bool
    reason: str | None


@dataclass
class ExchangeContext:
    request_id: str
    endpoint: str
    model: str
    stream: bool
    guardrails: GuardrailsConfig
    output_rules: bool  # any output rule at all (else text is not held back)
    policy: ToolPolicy | None
    tools: dict[str, Any]
    client_include_usage: bool = False
    client_continuous_usage: bool = False
    decisions: list[Decision] = field(default_factory=list)
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    first_output: float | None = None
    error_code: str | None = None
    judge: Any = None  # the served model as a classifier (None: no classifier rules)
    output_modify: bool = True  # any output rule that can change text (else audit only)

    def output_started(self) -> None:
        if self.first_output is None:
            self.first_output = time.monotonic()

    def check_call(self, name: str, arguments: str) -> ToolCallRecord:
        if self.policy is None:
            record = ToolCallRecord(name, arguments, True, None)
        else:
            verdict = check_tool_call(self.policy, self.tools, name, arguments)
            record = ToolCallRecord(name, arguments, verdict.allowed, verdict.reason)
        self.tool_calls.append(record)
        return record


@dataclass
class FilterStep:
    emit: str
    stop: Decision | None = None
    replacement: str | None = None


class TextFilter:
    """Output guardrails on one text (a choice, a message item), fed in pieces."""

    def __init__(self, ctx: ExchangeContext) -> None:
        self.ctx = ctx
        # no output rules: text passes as it comes (no hold-back window)
        self.checker = OutputChecker(ctx.guardrails) if ctx.output_rules else None
        self.emitted: list[str] = []
        self.stopped: Decision | None = None

    def _take(self, step) -> FilterStep:
        self.ctx.decisions.extend(step.decisions)
        if step.stop is not None:
            self.stopped = step.stop
        self.emitted.append(step.emit)
        return FilterStep(step.emit, step.stop, step.replacement)

    def feed(self, text: str) -> FilterStep:
        if self.stopped is not None or not text:
            return FilterStep("")
        if self.checker is None:
            self.emitted.append(text)
            return FilterStep(text)
        if not self.ctx.output_modify:  # audit only: the text goes now, checked whole at the end
            self.emitted.append(text)
            return FilterStep(text)
        return self._take(self.checker.feed(text))

    async def finish(self) -> FilterStep:
        if self.stopped is not None or self.checker is None:
            return FilterStep("")
        if not self.ctx.output_modify:  # the audit: once, on the whole text
            text = "".join(self.emitted)
            verdict = await check_output_async(self.ctx.guardrails, text, self.ctx.judge)
            self.ctx.decisions.extend(verdict.decisions)
            return FilterStep("")
        if self.checker.needs_judge:  # output classifier rules: asked once, at the end
            step = await self.checker.finish_async(self.ctx.judge)
        else:
            step = self.checker.finish()
        return self._take(step)

    async def whole(self, text: str) -> FilterStep:
        """The non-streamed text: the final text (or the stop)."""
        first = self.feed(text)
        if first.stop is not None:
            return FilterStep("".join(self.emitted), first.stop, first.replacement)
        last = await self.finish()
        return FilterStep("".join(self.emitted), last.stop, last.replacement)

    @property
    def text(self) -> str:
        return "".join(self.emitted)


def blocked_message(decision: Decision) -> str:
    return f"The {decision.stage} was blocked by policy (rule {decision.rule!r})."


def error_payload(decision: Decision) -> dict[str, Any]:
    return error_body(blocked_message(decision), INVALID_REQUEST, None, "guardrail_blocked")
