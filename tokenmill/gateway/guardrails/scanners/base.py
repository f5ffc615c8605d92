"""The scanner protocol and the one implementation all pattern scanners share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import regex

from tokenmill.gateway.guardrails.decision import Span
from tokenmill.gateway.guardrails.pattern_shape import Shape, shape_of


class Scanner(Protocol):
    detectors: tuple[Detector, ...]

    def scan(self, text: str, pos: int = 0) -> list[Span]: ...


@dataclass(frozen=True, slots=True)
class Detector:
    """One compiled pattern (the `regex` package, for its partial matching): `group` picks the
    reported part of a match, `check` vets it (a checksum, an entropy test) to keep false
    positives down. `shape` is what a stream needs to know of the pattern (see
    `pattern_shape`)."""

    label: str
    pattern: regex.Pattern[str]
    group: int = 0
    check: Callable[[str], bool] | None = None
    shape: Shape = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", shape_of(self.pattern.pattern, self.pattern.flags))

    def span(self, match: regex.Match[str], offset: int = 0) -> Span | None:
        """The reported span of a match (offsets moved by `offset`), None when vetted out."""
        start, end = match.span(self.group)
        if start >= end:
            return None
        found = match.group(self.group)
        if self.check is not None and not self.check(found):
            return None
        return Span(start + offset, end + offset, found, self.label)

    def scan(self, text: str, pos: int) -> list[Span]:
        return [s for m in self.pattern.finditer(text, pos) if (s := self.span(m)) is not None]


@dataclass(frozen=True, slots=True)
class PatternScanner:
    """Several detectors; spans come back sorted by start, then longest first."""

    detectors: tuple[Detector, ...]

    def scan(self, text: str, pos: int = 0) -> list[Span]:
        spans = [s for d in self.detectors for s in d.scan(text, pos)]
        spans.sort(key=lambda s: (s.start, -s.end))
        return spans
