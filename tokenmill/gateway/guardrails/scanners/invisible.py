"""Invisible and control characters: zero-width, bidi controls, Unicode tag characters
(ASCII smuggling), C0/C1 controls but \\n \\r \\t, and lone surrogates (possible in a str
decoded from JSON `\\ud800`). A zero-width joiner right after an emoji or other symbol is
emoji glue, not flagged. Each run of one kind (up to 64 chars) is one span."""

from __future__ import annotations

from tokenmill.gateway.guardrails.regex_safety import compile_checked
from tokenmill.gateway.guardrails.scanners.base import Detector, PatternScanner

_EMOJI_BEFORE = r"(?<![\u00a9\u00ae\u203c\u2049\u2122\u2139\u2190-\u2bff\ufe0f\U0001f000-\U0001faff\U0001f3fb-\U0001f3ff])"
INVISIBLE_DETECTORS = (
    Detector(
        "zero_width",
        compile_checked(
            r"(?:[\u200b\u200c\u2060-\u2064\ufeff\u180e]|" + _EMOJI_BEFORE + r"\u200d){1,64}"
        ),
    ),
    Detector("bidi", compile_checked(r"[\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]{1,64}")),
    Detector("tag", compile_checked(r"[\U000e0000-\U000e007f]{1,64}")),
    Detector("control", compile_checked(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]{1,64}")),
    Detector("surrogate", compile_checked(r"[\ud800-\udfff]{1,64}")),
)


def invisible_scanner() -> PatternScanner:
    return PatternScanner(INVISIBLE_DETECTORS)
