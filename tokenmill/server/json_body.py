"""JSON bodies read as hostile input: strict JSON (no NaN/Infinity, no lone surrogates,
bounded nesting, integers that fit 64 bits), then the endpoint's pydantic model; every
failure an APIError (a 4xx in the OpenAI envelope). Pure functions: the API process and its
parse process (parse_process.py) both run them."""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from tokenmill.server.errors import APIError, bad_request

MAX_JSON_DEPTH = 100  # schemas are bounded at 64 levels inside this (structured/limits.py)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# in a JSON text, what could make a lone surrogate (an escape of one) or an integer past 64
# bits (19 digits or more: -2**63 has 19); a text with neither needs only its containers walked
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
_MAYBE_BIG_INT = re.compile(rb"\d{19}")


def _depth_within(value: Any, max_depth: int) -> bool:
    """Nesting within max_depth, visiting containers only (C-speed filters over each list:
    100,000 token ids cost ~2 ms, not a Python step each)."""
    level: list[Any] = [value] if isinstance(value, dict | list) else []
    depth = 0
    while level:
        depth += 1
        if depth > max_depth:
            return False
        nested: list[Any] = []
        for node in level:
            items = node.values() if isinstance(node, dict) else node
            nested += [x for x in items if type(x) is dict or type(x) is list]
        level = nested
    return True


def _quick_check(text: str | bytes, value: Any, max_depth: int) -> bool:
    """True when `value`, parsed from `text`, passes check_json without walking its scalars."""
    if isinstance(text, str):
        try:
            raw = text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate in the text itself
            return False
    else:
        raw = text
    return (
        _MAYBE_SURROGATE.search(raw) is None
        and _MAYBE_BIG_INT.search(raw) is None
        and _depth_within(value, max_depth)
    )


def check_json(value: Any, max_depth: int = MAX_JSON_DEPTH, path: str = "") -> None:
    """Nesting within max_depth, strings that are valid Unicode (no lone surrogates) and
    integers msgpack can frame for the engine core ([-2**63, 2**64)), checked without
    recursion; the error names where (`param`, as pydantic's locations, below `path`)."""
    stack: list[tuple[Any, int, str]] = [(value, 1, path)]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, int) and not isinstance(node, bool):
            if not -(2**63) <= node < 2**64:
                raise bad_request(
                    f"{path or 'body'}: the integer {str(node)[:30]} does not fit 64 bits",
                    param=path or None,
                )
        elif isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError as e:
                raise bad_request(
                    f"{path or 'body'}: invalid string ({e.reason})", param=path or None
                ) from None
        elif isinstance(node, dict | list):
            if depth > max_depth:
                raise bad_request(f"the body is nested deeper than {max_depth} levels")
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, item in items:
                where = f"{path}.{key}" if path else str(key)
                if isinstance(key, str):
                    stack.append((key, depth, where))
                stack.append((item, depth + 1, where))


def parse_json(text: str | bytes, param: str | None = None) -> Any:
    """Strict JSON (a body, or a JSON document inside a field such as guided_json)."""
    where = f"{param}: " if param else "the body "
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise bad_request(
            f"{where}is nested deeper than {MAX_JSON_DEPTH} levels", param=param
        ) from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, huge integers, NaN
        raise bad_request(f"{where}is not valid JSON: {e}", param=param) from None
    if not _quick_check(text, value, MAX_JSON_DEPTH):
        check_json(value, path=param or "")  # finds what is wrong, and where
    return value


def decode_json(body: bytes) -> dict[str, Any]:
    data = parse_json(body)
    if not isinstance(data, dict):
        raise bad_request("the body must be a JSON object")
    return data


def _param_from_loc(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    # drop pydantic's union-branch tags (e.g. "str", "list[int]")
    return ".".join(p for p in parts if not _is_branch_tag(p))


def _is_branch_tag(part: str) -> bool:
    return (
        any(c in part for c in "[]")
        or part in ("str", "int", "float", "bool")
        or part.startswith(("constrained-", "function-", "lax-", "json-or-python"))
    )


def validation_error(err: ValidationError | RequestValidationError) -> APIError:
    errors = list(err.errors())
    first = _most_specific(errors)
    param = _param_from_loc(tuple(first.get("loc", ())))
    msg = first.get("msg", "invalid value")
    if first.get("type", "").endswith("_type"):  # a type mismatch: say every type allowed
        stem = _union_stem(first)
        others = [
            e.get("msg", "")
            for e in errors
            if e is not first and _union_stem(e) == stem and len(e["loc"]) == len(first["loc"])
        ]
        msg = " or ".join(dict.fromkeys([msg, *others]))
    return bad_request(f"{param}: {msg}" if param else msg, param=param or None)


def _union_stem(error: Any) -> tuple[Any, ...]:
    """The location up to the first union-branch tag (the field the union belongs to)."""
    loc = tuple(error.get("loc", ()))
    for i, part in enumerate(loc):
        if isinstance(part, str) and _is_branch_tag(part):
            return loc[:i]
    return loc


def _most_specific(errors: list[Any]) -> Any:
    """Of the errors pydantic reports for one field's union branches, the one that says the
    most: a value error in the branch the input's type matched (a list of 17 stop strings is
    "at most 16 items", not "Input should be a valid string")."""
    first = errors[0]
    stem = _union_stem(first)
    same_field = [e for e in errors if _union_stem(e) == stem]
    return max(
        same_field,
        key=lambda e: (not e.get("type", "").endswith("_type"), len(e.get("loc", ()))),
    )


def parse_model(body: bytes, model: type[BaseModel]) -> Any:
    data = decode_json(body)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e) from None
