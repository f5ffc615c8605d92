"""Refuse config regexes whose nested repetition can backtrack catastrophically.

Patterns are matched with the `regex` package (its partial matching lets a stream hold back
only what could still become a match, see `stream.py`); they are parsed and checked here
with the stdlib `re` parser, so a pattern must be valid for both. Config is trusted admin input,
user text is not: a pattern like `(a+)+$` takes exponential time on hostile text. We reject
a repeat nested in another repeat when either is unbounded or their bounds multiply past
`MAX_NESTED_PRODUCT`. This is a heuristic (overlapping alternations such as `(a|a)*` pass);
the per-call scan cap (`max_scan_chars`) bounds the rest."""

from __future__ import annotations

import re
import re._constants as sre_constants  # type: ignore[import-not-found]
import re._parser as sre_parse  # type: ignore[import-not-found]

import regex

from tokenmill.gateway.guardrails.sre_tree import REPEATS, children

MAX_PATTERN_CHARS = 1000
MAX_NESTED_PRODUCT = 1000
_UNBOUNDED = sre_constants.MAXREPEAT


def nested_repeat_problem(pattern: str) -> str | None:
    """Why `pattern` is refused, or None. The pattern must already compile."""
    return _walk(sre_parse.parse(pattern), outer=1)


def _walk(sub: object, outer: int) -> str | None:
    """`outer` is the product of the enclosing repeats' upper bounds (1: none)."""
    for op, av in sub:  # type: ignore[attr-defined]
        if op in REPEATS:
            high = av[1]
            if high > 1 and outer > 1:
                if _UNBOUNDED in (high, outer):
                    return (
                        "nested unbounded repetition (like `(a+)+`) can backtrack catastrophically"
                    )
                if high * outer > MAX_NESTED_PRODUCT:
                    return f"nested repetition bounds multiply past {MAX_NESTED_PRODUCT}"
            problem = _walk(av[2], _times(outer, high))
        else:
            problem = next((p for c in children(op, av) if (p := _walk(c, outer))), None)
        if problem:
            return problem
    return None


def _times(outer: int, high: int) -> int:
    if high <= 1:
        return outer
    if _UNBOUNDED in (outer, high):
        return _UNBOUNDED
    return min(outer * high, _UNBOUNDED - 1)


def compile_checked(pattern: str, flags: int = 0) -> regex.Pattern[str]:
    """Compile a built-in pattern with `regex`, asserting it passes the same checks as config
    patterns (valid for `re` too, no nested repetition)."""
    re.compile(pattern, flags)
    problem = nested_repeat_problem(pattern)
    if problem:
        raise AssertionError(f"built-in guardrail pattern {pattern!r}: {problem}")
    return regex.compile(pattern, flags)
