"""Request fields -> output constraints: response_format, structured_outputs / guided_*,
forced tool calls. Every problem is a 400 that names the field."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from tokenmill.openai.protocol import ChatCompletionRequest, SamplingFields
from tokenmill.server.errors import bad_request
from tokenmill.server.json_body import parse_json
from tokenmill.structured.grammar import GrammarCompiler, GrammarError
from tokenmill.structured.spec import StructuredOutputsParams
from tokenmill.structured.tools import tool_call_grammar


def _spec(param: str, **kwargs: Any) -> StructuredOutputsParams:
    try:
        return StructuredOutputsParams(**kwargs)
    except ValueError as e:
        raise bad_request(f"{param}: {e}", param=param) from e


def requested_constraints(req: SamplingFields) -> list[tuple[str, StructuredOutputsParams]]:
    """All constraints the request asks for, with the field each came from."""
    found: list[tuple[str, StructuredOutputsParams]] = []
    fmt = getattr(req, "response_format", None)
    if fmt is not None and fmt.type == "json_object":
        found.append(("response_format", _spec("response_format", json=True)))
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise bad_request(
                "response_format.json_schema: is required for type json_schema",
                "response_format.json_schema",
            )
        found.append(("response_format", _spec("response_format", json=fmt.json_schema.schema_)))
    so = req.structured_outputs
    if so is not None:
        choice = tuple(so.choice) if so.choice is not None else None
        found.append(
            (
                "structured_outputs",
                _spec(
                    "structured_outputs",
                    json=so.json_,
                    regex=so.regex,
                    grammar=so.grammar,
                    choice=choice,
                ),
            )
        )
    if req.guided_json is not None:
        schema = req.guided_json
        if isinstance(schema, str):  # checked like a body: it reaches the engine core too
            schema = parse_json(schema, "guided_json")
        found.append(("guided_json", _spec("guided_json", json=schema)))
    if req.guided_regex is not None:
        found.append(("guided_regex", _spec("guided_regex", regex=req.guided_regex)))
    if req.guided_choice is not None:
        found.append(("guided_choice", _spec("guided_choice", choice=tuple(req.guided_choice))))
    if req.guided_grammar is not None:
        found.append(("guided_grammar", _spec("guided_grammar", grammar=req.guided_grammar)))
    return found


def tools_to_force(req: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The tools a call must be made to (tool_choice required / named), else None.
    Inconsistent tool settings are a 400."""
    choice = req.tool_choice
    if choice is not None and choice != "none" and not req.tools:
        raise bad_request("tool_choice: requires `tools`", "tool_choice")
    if not req.tools or choice in (None, "none", "auto"):
        return None
    tools = [t.model_dump(by_alias=True, exclude_none=True) for t in req.tools]
    if choice == "required":
        return tools
    named = [t for t in tools if t["function"]["name"] == choice.function.name]
    if not named:
        raise bad_request(
            f"tool_choice: function {choice.function.name!r} is not among the request's tools",
            "tool_choice",
        )
    return named


async def build_constraint(
    compiler: Callable[[], Awaitable[GrammarCompiler]],
    req: SamplingFields,
    forced_tools: list[dict[str, Any]] | None = None,
) -> StructuredOutputsParams | None:
    """The request's output constraint, compiled once here (off the event loop, on a
    large-stack thread) so that a bad one is a 400 before the engine sees it. `compiler`
    gives the grammar compiler, built on first use: a request without a constraint never
    waits for it."""
    found = requested_constraints(req)
    if forced_tools:
        # one forced call unless several were asked for explicitly
        parallel = getattr(req, "parallel_tool_calls", None) is True
        found.append(
            (
                "tool_choice",
                StructuredOutputsParams(grammar=tool_call_grammar(forced_tools, parallel)),
            )
        )
    if len(found) > 1:
        raise bad_request(
            f"{found[1][0]}: only one output constraint per request (also got {found[0][0]})",
            found[1][0],
        )
    if not found:
        return None
    param, spec = found[0]
    try:
        await (await compiler()).acompile(spec)
    except GrammarError as e:
        raise bad_request(f"{param}: {e}", param) from e
    return spec
