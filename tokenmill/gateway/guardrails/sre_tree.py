"""Walking a parsed regular expression (the standard library's parser): which opcodes repeat
and which sub-patterns an opcode holds. Shared by the config-regex safety check and the
stream's pattern shapes."""

from __future__ import annotations

import re._constants as c  # type: ignore[import-not-found]

REPEATS = {c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", c.MAX_REPEAT)}
ATOMIC = getattr(c, "ATOMIC_GROUP", None)


def children(op: object, av: object) -> list[object]:
    """The sub-patterns of one parsed item (lookarounds included)."""
    if op in REPEATS:
        return [av[2]]  # type: ignore[index]
    if op is c.SUBPATTERN:
        return [av[3]]  # type: ignore[index]
    if op is c.BRANCH:
        return list(av[1])  # type: ignore[index]
    if op in (c.ASSERT, c.ASSERT_NOT):
        return [av[1]]  # type: ignore[index]
    if op is c.GROUPREF_EXISTS:
        return [p for p in av[1:] if p is not None]  # type: ignore[index]
    if ATOMIC is not None and op is ATOMIC:
        return [av]
    return []
