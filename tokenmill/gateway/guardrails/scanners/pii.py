"""Personal data: email, phone, credit card (Luhn), IBAN (mod 97), US SSN, IPv4.

Tuned for few false positives: phone numbers need a `+country` prefix or US punctuation
(`(415) 555-2671`, `415-555-2671`), so bare digit runs, dates and versions are not phones;
card numbers need 4-digit grouping and a valid Luhn sum and issuer digit; `version 1.2.3.4`
and `v1.2.3.4` are not IP addresses."""

from __future__ import annotations

from tokenmill.gateway.guardrails.regex_safety import compile_checked
from tokenmill.gateway.guardrails.scanners.base import Detector, PatternScanner


def luhn_valid(number: str) -> bool:
    digits = [int(c) for c in number if c.isdigit()]
    total = 0
    for i, d in enumerate(reversed(digits)):
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return bool(digits) and total % 10 == 0


def _card(text: str) -> bool:
    digits = "".join(c for c in text if c.isdigit())
    return 13 <= len(digits) <= 19 and digits[0] in "23456" and luhn_valid(digits)


def iban_valid(text: str) -> bool:
    s = text.replace(" ", "").upper()
    if not 15 <= len(s) <= 34:
        return False
    moved = s[4:] + s[:4]
    return int("".join(str(int(c, 36)) for c in moved)) % 97 == 1


def _phone(text: str) -> bool:
    return 8 <= sum(c.isdigit() for c in text) <= 15


_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
PII_DETECTORS = {
    "email": Detector(
        "email",
        compile_checked(
            r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@(?:[A-Za-z0-9-]{1,63}\.){1,8}[A-Za-z]{2,24}(?![\w-])"
        ),
    ),
    "phone": Detector(
        "phone",
        compile_checked(
            r"(?<![\w+])(?:\+[1-9]\d{0,2}(?:[ .-]?\(?\d{1,4}\)?){2,5}"
            r"|(?:\([2-9]\d{2}\)[ ]?|(?<![\d(.-])[2-9]\d{2}[.-])\d{3}[.-]\d{4})(?![\w-]|\.\d)"
        ),
        check=_phone,
    ),
    "credit_card": Detector(
        "credit_card",
        compile_checked(
            r"(?<![\d-])(?:\d{4}(?P<s>[ -]?)\d{4}(?P=s)\d{4}(?P=s)\d{4}(?:(?P=s)?\d{1,3})?"
            r"|3[47]\d{2}(?P<t>[ -]?)\d{6}(?P=t)\d{5})(?![\d-])"
        ),
        check=_card,
    ),
    "iban": Detector(
        "iban",
        compile_checked(
            r"(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?(?![A-Za-z0-9])"
        ),
        check=iban_valid,
    ),
    "ssn": Detector(
        "ssn",
        compile_checked(r"(?<![\d-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\d-])"),
    ),
    "ipv4": Detector(
        "ipv4",
        compile_checked(
            rf"(?<![\w.])(?<![Vv]ersion )(?<![Vv]er )(?:{_OCTET}\.){{3}}{_OCTET}(?!\.?\d)"
        ),
    ),
}
PII_ENTITIES = tuple(PII_DETECTORS)
DEFAULT_PII_ENTITIES = ("email", "phone", "credit_card", "iban", "ssn")  # ipv4: opt in


def pii_scanner(entities: tuple[str, ...]) -> PatternScanner:
    return PatternScanner(tuple(PII_DETECTORS[e] for e in entities))
