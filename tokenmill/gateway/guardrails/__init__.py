"""Guardrails: rules from the gateway config that scan request and response text and block,
replace, redact or audit it. Pure library (no HTTP): the gateway middleware extracts texts,
parses streams and turns decisions into responses and metrics."""

from __future__ import annotations

from tokenmill.gateway.guardrails.classifier import Judge
from tokenmill.gateway.guardrails.config import parse_guardrails
from tokenmill.gateway.guardrails.decision import Action, Decision, Span, Stage
from tokenmill.gateway.guardrails.input_check import InputVerdict, check_input
from tokenmill.gateway.guardrails.rule import GuardrailsConfig, Rule
from tokenmill.gateway.guardrails.stream import (
    OutputChecker,
    OutputVerdict,
    StreamStep,
    check_output,
    check_output_async,
)
from tokenmill.gateway.guardrails.text_check import TextVerdict, check_text

__all__ = [
    "Action",
    "Decision",
    "GuardrailsConfig",
    "InputVerdict",
    "Judge",
    "OutputChecker",
    "OutputVerdict",
    "Rule",
    "Span",
    "Stage",
    "StreamStep",
    "TextVerdict",
    "check_input",
    "check_output",
    "check_output_async",
    "check_text",
    "parse_guardrails",
]
