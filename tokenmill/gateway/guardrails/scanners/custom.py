"""Admin-configured scanners: one regex, or a deny list of terms."""

from __future__ import annotations

import re

import regex

from tokenmill.gateway.guardrails.scanners.base import Detector, PatternScanner


def regex_scanner(label: str, pattern: regex.Pattern[str]) -> PatternScanner:
    return PatternScanner((Detector(label, pattern),))


def deny_list_pattern(terms: tuple[str, ...]) -> str:
    """Case-insensitive whole words; any whitespace run (up to 8) matches a term's space.
    Longest terms first so "acme corp" wins over "acme"."""
    words = sorted({t.strip() for t in terms}, key=len, reverse=True)
    alternatives = [r"[\s]{1,8}".join(re.escape(w) for w in term.split()) for term in words]
    return r"(?<!\w)(?:" + "|".join(alternatives) + r")(?!\w)"
