"""Prompt-injection markers: "ignore previous instructions" and kin, jailbreak personas,
fake chat-template role markers. Markers, not intent: pair with a classifier for more."""

from __future__ import annotations

import re

from tokenmill.gateway.guardrails.regex_safety import compile_checked
from tokenmill.gateway.guardrails.scanners.base import Detector, PatternScanner

_S = r"[\s]{1,4}"  # bounded whitespace keeps matches short
_I = re.IGNORECASE
INJECTION_DETECTORS = (
    Detector(
        "ignore_instructions",
        compile_checked(
            rf"\b(?:ignore|disregard|forget|override|bypass){_S}(?:(?:all|any|every|of|the|your|my|these|those){_S}){{0,3}}"
            rf"(?:previous|prior|above|earlier|preceding|system|original|initial|developer)"
            rf"{_S}(?:instructions?|prompts?|rules|directions|directives|guidelines|messages?|context)\b",
            _I,
        ),
    ),
    Detector(
        "jailbreak_persona",
        compile_checked(
            rf"\byou{_S}are{_S}now{_S}(?:DAN\b|in{_S}developer{_S}mode|jailbroken|(?:an?{_S})?unrestricted|unfiltered)"
            rf"|\b(?:do{_S}anything{_S}now|developer{_S}mode{_S}enabled)\b",
            _I,
        ),
    ),
    Detector(
        "role_marker",
        compile_checked(
            r"<\|(?:im_start|im_end|system|endoftext|start_header_id|end_header_id|eot_id)\|>"
            r"|\[/?INST\]|<</?SYS>>"
            r"|(?:^|(?<=\n))[ \t]{0,8}#{2,6}[ \t]{0,4}(?:system|assistant|developer)[ \t]{0,4}:",
            _I,
        ),
    ),
)


def injection_scanner() -> PatternScanner:
    return PatternScanner(INJECTION_DETECTORS)
