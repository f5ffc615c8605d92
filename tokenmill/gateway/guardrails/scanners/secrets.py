"""Secrets and credentials: cloud keys, tokens, PEM private keys, JWTs, `password=...`.

Token bodies are bounded (at most a few hundred chars) so no match runs away; a PEM block
matches whole when its END line is within 8192 chars, else its BEGIN line alone."""

from __future__ import annotations

import math
import re
from collections import Counter

from tokenmill.gateway.guardrails.regex_safety import compile_checked
from tokenmill.gateway.guardrails.scanners.base import Detector, PatternScanner


def shannon_entropy(value: str) -> float:
    """Bits per character."""
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in Counter(value).values()) if n else 0.0


def _looks_secret(value: str) -> bool:
    """A high-entropy value, not a word or a code reference like `os.environ`."""
    if shannon_entropy(value) < min(3.0, 0.8 * math.log2(len(value))):
        return False
    has_digit = any(c.isdigit() for c in value)
    mixed = any(c.islower() for c in value) and any(c.isupper() for c in value)
    return has_digit or (mixed and len(value) >= 16)


_I = re.IGNORECASE
SECRET_DETECTORS = (
    Detector(
        "aws_access_key",
        compile_checked(r"(?<![A-Z0-9])(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Z0-9])"),
    ),
    Detector(
        "private_key",
        compile_checked(
            r"-----BEGIN (?:[A-Z0-9]{1,20} ){0,3}PRIVATE KEY-----"
            r"(?:[\s\S]{0,8192}?-----END (?:[A-Z0-9]{1,20} ){0,3}PRIVATE KEY-----)?"
        ),
    ),
    Detector(
        "github_token",
        compile_checked(
            r"(?<![\w-])(?:gh[pousr]_[A-Za-z0-9]{36,251}|github_pat_[A-Za-z0-9_]{22,255})(?![\w-])"
        ),
    ),
    Detector(
        "slack_token", compile_checked(r"(?<![\w-])xox[abposr]-[A-Za-z0-9-]{10,250}(?![\w-])")
    ),
    Detector(
        "api_key", compile_checked(r"(?<![\w-])sk-(?:[a-z]{2,10}-)?[A-Za-z0-9_-]{20,250}(?![\w-])")
    ),
    Detector(
        "jwt",
        compile_checked(
            r"(?<![\w-])eyJ[A-Za-z0-9_-]{5,1000}\.eyJ[A-Za-z0-9_-]{5,4000}\.[A-Za-z0-9_-]{0,1000}(?![\w-])"
        ),
    ),
    Detector(
        "bearer_token",
        compile_checked(r"\bBearer[ \t]{1,4}([A-Za-z0-9._~+/-]{20,500}=*)", _I),
        group=1,
        check=_looks_secret,
    ),
    Detector(
        "credential_assignment",
        compile_checked(
            r"\b(?:password|passwd|pwd|secret|client[_-]?secret|api[_-]?key|access[_-]?key"
            r"|secret[_-]?key|(?:access|auth|refresh)[_-]?token)\b[\"']?[ \t]{0,4}[:=][ \t]{0,4}[\"']?"
            r"([^\s\"'&,;()\[\]{}<>$`]{8,200})",
            _I,
        ),
        group=1,
        check=_looks_secret,
    ),
)


def secrets_scanner() -> PatternScanner:
    return PatternScanner(SECRET_DETECTORS)
