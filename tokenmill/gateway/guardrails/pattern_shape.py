"""What a pattern's syntax tells a stream about its matches, read from the stdlib `re` parse:
which characters a match can start with (so a pattern the new text cannot start is not
searched again), how far its lookaheads and end anchors may read past a match's end (a
match is final only once that much text follows it), and how far its lookbehinds and word
boundaries read before a position (the context a stream keeps). Every answer errs on the
side of searching, holding and keeping more."""

from __future__ import annotations

import re
import re._constants as c  # type: ignore[import-not-found]
import re._parser as sre_parse  # type: ignore[import-not-found]
import string
from dataclasses import dataclass
from functools import lru_cache

from tokenmill.gateway.guardrails.sre_tree import ATOMIC, REPEATS, children

# Lookaround reach beyond this is treated as unbounded: a stream's window is at most 4096.
MAX_REACH = 4096
_RE_FLAGS = re.IGNORECASE | re.MULTILINE | re.DOTALL | re.VERBOSE | re.ASCII
_SPACE = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"
_CATEGORIES = {
    c.CATEGORY_DIGIT: string.digits,
    c.CATEGORY_SPACE: _SPACE,
    c.CATEGORY_WORD: string.ascii_letters + string.digits + "_",
}
# `$` may match before a final newline: it reads two characters; `\Z`, `\b`, `\B` read one.
_AT_AHEAD = {c.AT_END: 2, c.AT_END_STRING: 1, c.AT_END_LINE: 1, c.AT_BOUNDARY: 1}
_AT_AHEAD[c.AT_NON_BOUNDARY] = 1
_AT_BEHIND = {c.AT_BOUNDARY: 1, c.AT_NON_BOUNDARY: 1, c.AT_BEGINNING_LINE: 1}


@dataclass(frozen=True, slots=True)
class Shape:
    """`first`: the ASCII characters a match can start with, None for any character (or an
    empty match); `first_non_ascii`: whether a non-ASCII character may start one. `ahead`:
    characters past a match's end that lookaheads and anchors may read; `behind`: characters
    before a position that lookbehinds and word boundaries may read."""

    first: frozenset[str] | None
    first_non_ascii: bool
    ahead: int
    behind: int

    def may_start(self, chars: set[str], non_ascii: bool) -> bool:
        """Whether a match could start at one of `chars` (`non_ascii`: some are non-ASCII)."""
        if self.first is None or (non_ascii and self.first_non_ascii):
            return True
        return not self.first.isdisjoint(chars)


ANY_SHAPE = Shape(None, True, MAX_REACH, MAX_REACH)


@lru_cache(maxsize=1024)
def shape_of(source: str, flags: int = 0) -> Shape:
    try:
        parsed = sre_parse.parse(source, flags & _RE_FLAGS)
    except (re.error, TypeError, ValueError, OverflowError, RecursionError):
        return ANY_SHAPE  # valid for `regex` only: search always, settle only when forced
    first = _First()
    nullable = first.seq(parsed, bool(parsed.state.flags & re.IGNORECASE))
    chars = None if nullable or first.any else frozenset(first.chars)
    return Shape(chars, first.non_ascii, _ahead(parsed), _behind(parsed))


class _First:
    def __init__(self) -> None:
        self.chars: set[str] = set()
        self.non_ascii = False
        self.any = False

    def seq(self, sub: object, ic: bool) -> bool:
        """Collects the first characters of a sequence; True when it can match empty."""
        return all(self.item(op, av, ic) for op, av in sub)  # type: ignore[attr-defined]

    def item(self, op: object, av: object, ic: bool) -> bool:
        if op is c.LITERAL:
            self.char(chr(av), ic)  # type: ignore[arg-type]
            return False
        if op is c.IN:
            self.char_class(av, ic)
            return False
        if op is c.BRANCH:
            return any([self.seq(alt, ic) for alt in av[1]])  # type: ignore[index]  # all alternatives
        if op is c.SUBPATTERN:
            _, add, remove, sub = av  # type: ignore[misc]
            return self.seq(sub, (ic or bool(add & re.IGNORECASE)) and not remove & re.IGNORECASE)
        if op in REPEATS:
            low, _, sub = av  # type: ignore[misc]
            return self.seq(sub, ic) or low == 0
        if ATOMIC is not None and op is ATOMIC:
            return self.seq(av, ic)
        if op in (c.AT, c.ASSERT, c.ASSERT_NOT):
            return True  # zero width: restricts, never adds a first character
        self.any = True  # `.`, [^x], backreferences, conditionals, anything else
        return op is not c.ANY and op is not c.NOT_LITERAL

    def char(self, ch: str, ic: bool) -> None:
        if not ch.isascii():
            self.non_ascii = True
            return
        self.chars.add(ch)
        if ic and ch.isalpha():
            self.chars |= {ch.lower(), ch.upper()}
            self.non_ascii = True  # case folding: the Kelvin sign, the long s, the dotless i...

    def char_class(self, items: object, ic: bool) -> None:
        for op, av in items:  # type: ignore[attr-defined]
            if op is c.LITERAL:
                self.char(chr(av), ic)
            elif op is c.RANGE:
                low, high = av
                for code in range(low, min(high, 127) + 1):
                    self.char(chr(code), ic)
                self.non_ascii |= high > 127
            elif op is c.CATEGORY and av in _CATEGORIES:
                self.chars.update(_CATEGORIES[av])
                self.non_ascii = True
            else:  # NEGATE, \D \W \S, anything else
                self.any = True


def _width(sub: object) -> int:
    return min(sub.getwidth()[1], MAX_REACH)  # type: ignore[attr-defined]


def _reach(sub: object, direction: int, anchors: dict) -> int:
    """How far a lookaround in `direction` (1 ahead, -1 behind) or an anchor of `anchors`
    in `sub` may read past the position it is tried at."""
    reach = 0
    for op, av in sub:  # type: ignore[attr-defined]
        if op in (c.ASSERT, c.ASSERT_NOT):
            way, inner = av
            here = _reach(inner, direction, anchors)
            if way == direction:
                here += _width(inner)
        elif op is c.AT:
            here = anchors.get(av, 0)
        else:
            here = max((_reach(ch, direction, anchors) for ch in children(op, av)), default=0)
        reach = max(reach, here)
    return min(reach, MAX_REACH)


def _ahead(sub: object) -> int:
    """How far past the position it is tried at (at most a match's end) a lookahead or an
    end anchor in `sub` may read."""
    return _reach(sub, 1, _AT_AHEAD)


def _behind(sub: object) -> int:
    """How far before the position it is tried at a lookbehind or `\\b` in `sub` may read."""
    return _reach(sub, -1, _AT_BEHIND)
