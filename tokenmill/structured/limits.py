"""Bounds on output constraints, checked before anything reaches llguidance.

llguidance compiles recursively: a `$ref` chain of a few thousand schemas or a Lark grammar
chaining a few thousand rules overflows a thread's stack (a segfault that takes the process
down). Compilation also runs on a thread with a large stack (grammar.py); these bounds keep
every accepted constraint far inside it and give the client a 400 that names the limit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tokenmill.structured.spec import StructuredOutputsParams


class ConstraintTooLargeError(ValueError):
    """A constraint over one of the limits (a client mistake: HTTP 400)."""


@dataclass(frozen=True)
class ConstraintLimits:
    max_schema_depth: int = 64  # nesting of objects/arrays in the JSON schema document
    max_schema_refs: int = 1000  # `$ref` occurrences
    max_grammar_bytes: int = 256 * 1024
    max_grammar_rules: int = 2000
    max_regex_bytes: int = 16 * 1024
    max_choices: int = 10_000
    # counted repetition (`x{n}`, `x{n,m}` in a regex or pattern, `x~n` in Lark): llguidance
    # unrolls it, so a count in the hundreds of thousands takes ~0.4 s of an engine step for
    # the first mask (stalling every request in the batch) and in the millions breaks mid-way
    max_repeat: int = 10_000
    # ...and nested counts multiply (`(a{1000}){1000}` is a million): the whole regex unrolled
    max_unrolled: int = 100_000


DEFAULT_LIMITS = ConstraintLimits()

# A Lark rule or terminal definition: `name:` / `?name:` / `NAME.2:` at the start of a line.
_RULE = re.compile(r"^[ \t]*[?!]?[A-Za-z_][A-Za-z0-9_]*(?:\.-?\d+)?[ \t]*:", re.MULTILINE)


_REGEX_REPEAT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
_LARK_REPEAT = re.compile(r"~\s*(\d+)(?:\s*\.\.\s*(\d+))?")


def largest_repeat(text: str, pattern: re.Pattern[str] = _REGEX_REPEAT) -> int:
    """The largest repetition count written in a regex (or Lark grammar) text."""
    counts = (
        int(n) if len(n) <= 9 else 10**9 for m in pattern.finditer(text) for n in m.groups() if n
    )
    return max(counts, default=0)


def unrolled_size(regex: str) -> int:
    """How many atoms a regex becomes with its counted repetitions written out (nested counts
    multiply, a sequence adds); 0 where Python's parser does not read it (the compiler then
    judges it)."""
    try:
        from re import _constants as c
        from re import _parser

        tree = _parser.parse(regex)
    except Exception:  # another dialect's syntax, or not a regex at all
        return 0
    total, stack = 0, [(tree, 1)]
    while stack:
        items, factor = stack.pop()
        for op, arg in items:
            if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
                low, high, body = arg
                stack.append((body, factor * max(1, high if high != c.MAXREPEAT else low)))
            elif op is c.SUBPATTERN:
                stack.append((arg[-1], factor))
            elif op is c.BRANCH:
                stack.extend((branch, factor) for branch in arg[1])
            elif op in (c.ASSERT, c.ASSERT_NOT):
                stack.append((arg[1], factor))
            else:
                total += factor
        if total > 10**12:
            break
    return total


def schema_patterns(schema: Any) -> tuple[list[str], int]:
    """Every regex of a JSON schema (`pattern` values, `patternProperties` keys), and how many
    `enum` values it lists in all."""
    found: list[str] = []
    enums = 0
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                found.append(node["pattern"])
            if isinstance(node.get("patternProperties"), dict):
                found.extend(node["patternProperties"])
            if isinstance(node.get("enum"), list):
                enums += len(node["enum"])
            stack.extend(v for v in node.values() if isinstance(v, dict | list))
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, dict | list))
    return found, enums


def _check_repeat(count: int, where: str, limits: ConstraintLimits) -> None:
    if count > limits.max_repeat:
        raise ConstraintTooLargeError(
            f"{where} repeats {count} times; the limit is {limits.max_repeat}"
        )


def _check_regex(regex: str, where: str, limits: ConstraintLimits) -> None:
    _check_repeat(largest_repeat(regex), where, limits)
    size = unrolled_size(regex)
    if size > limits.max_unrolled:
        raise ConstraintTooLargeError(
            f"{where} unrolls to {size} atoms (its repetition counts multiplied); the limit is "
            f"{limits.max_unrolled}"
        )


def schema_shape(schema: Any) -> tuple[int, int]:
    """(nesting depth, `$ref` count) of a JSON document, without recursion."""
    depth = refs = 0
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            depth = max(depth, level)
            refs += "$ref" in node
            stack.extend((v, level + 1) for v in node.values() if isinstance(v, dict | list))
        elif isinstance(node, list):
            depth = max(depth, level)
            stack.extend((v, level + 1) for v in node if isinstance(v, dict | list))
    return depth, refs


def check_limits(spec: StructuredOutputsParams, limits: ConstraintLimits = DEFAULT_LIMITS) -> None:
    """Raises ConstraintTooLargeError naming the limit a constraint exceeds."""
    if isinstance(spec.json, dict):
        depth, refs = schema_shape(spec.json)
        if depth > limits.max_schema_depth:
            raise ConstraintTooLargeError(
                f"the JSON schema is nested {depth} levels deep; the limit is "
                f"{limits.max_schema_depth}"
            )
        if refs > limits.max_schema_refs:
            raise ConstraintTooLargeError(
                f"the JSON schema has {refs} $ref; the limit is {limits.max_schema_refs}"
            )
        patterns, enums = schema_patterns(spec.json)
        for pattern in patterns:
            _check_regex(pattern, "a pattern", limits)
        if enums > limits.max_choices:  # an enum is a choice list
            raise ConstraintTooLargeError(
                f"the JSON schema's enums list {enums} values; the limit is {limits.max_choices}"
            )
    if spec.regex is not None and len(spec.regex.encode()) > limits.max_regex_bytes:
        raise ConstraintTooLargeError(
            f"the regex is {len(spec.regex.encode())} bytes; the limit is {limits.max_regex_bytes}"
        )
    if spec.regex is not None:
        _check_regex(spec.regex, "the regex", limits)
    if spec.grammar is not None:
        size = len(spec.grammar.encode())
        if size > limits.max_grammar_bytes:
            raise ConstraintTooLargeError(
                f"the grammar is {size} bytes; the limit is {limits.max_grammar_bytes}"
            )
        rules = len(_RULE.findall(spec.grammar))
        if rules > limits.max_grammar_rules:
            raise ConstraintTooLargeError(
                f"the grammar defines {rules} rules; the limit is {limits.max_grammar_rules}"
            )
        refs = spec.grammar.count("$ref")  # schemas embedded with %json
        if refs > limits.max_schema_refs:
            raise ConstraintTooLargeError(
                f"the grammar's JSON schemas have {refs} $ref; the limit is "
                f"{limits.max_schema_refs}"
            )
        repeat = max(largest_repeat(spec.grammar), largest_repeat(spec.grammar, _LARK_REPEAT))
        _check_repeat(repeat, "the grammar", limits)
    if spec.choice is not None and len(spec.choice) > limits.max_choices:
        raise ConstraintTooLargeError(
            f"{len(spec.choice)} choices; the limit is {limits.max_choices}"
        )
