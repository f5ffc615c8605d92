"""The scanner protocol and the one implementation all pattern scanners share."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tokenmill.gateway.guardrails.decision import Span


class Scanner(Protocol):
    def scan(self, text: str, pos: int = 0) -> list[Span]: ...


@dataclass(frozen=True, slots=True)
class Detector:
    """One compiled pattern: `group` picks the reported part of a match, `check` vets it
    (a checksum, an entropy test) to keep false positives down."""

    label: str
    pattern: re.Pattern[str]
    group: int = 0
    check: Callable[[str], bool] | None = None

    def scan(self, text: str, pos: int) -> list[Span]:
        spans = []
        for m in self.pattern.finditer(text, pos):
            start, end = m.span(self.group)
            found = m.group(self.group)
            if start < end and (self.check is None or self.check(found)):
                spans.append(Span(start, end, found, self.label))
        return spans


@dataclass(frozen=True, slots=True)
class PatternScanner:
    """Several detectors; spans come back sorted by start, then longest first."""

    detectors: tuple[Detector, ...]

    def scan(self, text: str, pos: int = 0) -> list[Span]:
        spans = [s for d in self.detectors for s in d.scan(text, pos)]
        spans.sort(key=lambda s: (s.start, -s.end))
        return spans
