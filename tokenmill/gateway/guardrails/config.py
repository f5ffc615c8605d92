"""`parse_guardrails`: the `guardrails:` config section to a frozen `GuardrailsConfig`.
Every bad value raises `GatewayConfigError` naming its path (`guardrails.rules[2].action`)."""

from __future__ import annotations

import re
import string

import regex

from tokenmill.gateway.errors import GatewayConfigError
from tokenmill.gateway.guardrails.decision import Action, Stage
from tokenmill.gateway.guardrails.fields import Fields
from tokenmill.gateway.guardrails.regex_safety import MAX_PATTERN_CHARS, nested_repeat_problem
from tokenmill.gateway.guardrails.rule import (
    DEFAULT_HOLD_BACK,
    DEFAULT_MASK,
    DEFAULT_MAX_SCAN_CHARS,
    MAX_HOLD_BACK,
    MAX_SCAN_CHARS,
    ClassifierSpec,
    GuardrailsConfig,
    Rule,
)
from tokenmill.gateway.guardrails.scanners import Scanner
from tokenmill.gateway.guardrails.scanners.custom import deny_list_pattern, regex_scanner
from tokenmill.gateway.guardrails.scanners.injection import injection_scanner
from tokenmill.gateway.guardrails.scanners.invisible import invisible_scanner
from tokenmill.gateway.guardrails.scanners.pii import (
    DEFAULT_PII_ENTITIES,
    PII_ENTITIES,
    pii_scanner,
)
from tokenmill.gateway.guardrails.scanners.secrets import secrets_scanner

SCANNERS = (
    "regex",
    "deny_list",
    "secrets",
    "pii",
    "invisible",
    "injection",
    "length",
    "classifier",
)
# Scanners that find no span to mask: `redact` makes no sense for them.
_NO_REDACT = {"length", "classifier"}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_RULES = 200
MAX_TERMS = 1000


def parse_guardrails(raw: object, path: str = "guardrails") -> GuardrailsConfig:
    if raw is None:
        return GuardrailsConfig()
    f = Fields(raw, path)
    hold_back = f.integer("hold_back_chars", DEFAULT_HOLD_BACK, 8, MAX_HOLD_BACK)
    max_scan = f.integer("max_scan_chars", DEFAULT_MAX_SCAN_CHARS, 1000, MAX_SCAN_CHARS)
    items = f.get("rules", [])
    if not isinstance(items, list):
        raise GatewayConfigError(f.at("rules"), "expected a list of rules")
    if len(items) > MAX_RULES:
        raise GatewayConfigError(f.at("rules"), f"at most {MAX_RULES} rules, got {len(items)}")
    f.done()
    rules: list[Rule] = []
    for i, item in enumerate(items):
        rule = _rule(item, f"{f.at('rules')}[{i}]")
        if any(r.name == rule.name for r in rules):
            raise GatewayConfigError(
                f"{f.at('rules')}[{i}].name", f"duplicate rule name {rule.name!r}"
            )
        rules.append(rule)
    return GuardrailsConfig(tuple(rules), hold_back, max_scan)


def _rule(raw: object, path: str) -> Rule:
    f = Fields(raw, path)
    name = f.text("name", max_len=64)
    if not _NAME.fullmatch(name):
        raise GatewayConfigError(f.at("name"), "letters, digits, '_', '.', '-' (up to 64)")
    kind = f.choice("scanner", None, SCANNERS)
    stages = _stages(f)
    action = Action(f.choice("action", None, tuple(a.value for a in Action)))
    if action is Action.REDACT and kind in _NO_REDACT:
        raise GatewayConfigError(
            f.at("action"), f"a {kind} rule cannot redact (block, fallback or audit)"
        )
    fallback = f.text("fallback", max_len=20_000, empty=True) if f.has("fallback") else None
    if action is Action.FALLBACK and fallback is None:
        raise GatewayConfigError(f.at("fallback"), "is required when action is fallback")
    if action is not Action.FALLBACK and fallback is not None:
        raise GatewayConfigError(f.at("fallback"), "only for action: fallback")
    mask = DEFAULT_MASK
    if f.has("mask"):
        if action is not Action.REDACT:
            raise GatewayConfigError(f.at("mask"), "only for action: redact")
        mask = _mask(f.text("mask", max_len=200, empty=True), f.at("mask"))
    scanner, max_chars, classifier = _scanner(kind, name, f)
    f.done()
    return Rule(name, kind, stages, action, scanner, mask, fallback, max_chars, classifier)


def _stages(f: Fields) -> frozenset[Stage]:
    values = f.str_list("stages", ["input", "output"], max_items=2, max_len=16)
    for i, v in enumerate(values):
        if v not in ("input", "output"):
            raise GatewayConfigError(
                f"{f.at('stages')}[{i}]", f"must be input or output, got {v!r}"
            )
    if len(set(values)) != len(values):
        raise GatewayConfigError(f.at("stages"), "duplicate stage")
    return frozenset(Stage(v) for v in values)


def _mask(mask: str, path: str) -> str:
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(mask) if name is not None}
    except ValueError as e:
        raise GatewayConfigError(path, f"bad template: {e}") from None
    if not fields <= {"entity", "rule"}:
        raise GatewayConfigError(path, "only {entity} and {rule} may be used")
    try:
        mask.format(entity="x", rule="x")
    except (ValueError, IndexError, KeyError) as e:
        raise GatewayConfigError(path, f"bad template: {e}") from None
    return mask


def _scanner(
    kind: str, name: str, f: Fields
) -> tuple[Scanner | None, int | None, ClassifierSpec | None]:
    if kind == "regex":
        return regex_scanner(name, _regex(f)), None, None
    if kind == "deny_list":
        terms = f.str_list("terms", None, max_items=MAX_TERMS, max_len=200)
        pattern = regex.compile(deny_list_pattern(terms), regex.IGNORECASE)
        return regex_scanner(name, pattern), None, None
    if kind == "pii":
        entities = f.str_list(
            "entities", list(DEFAULT_PII_ENTITIES), max_items=len(PII_ENTITIES), max_len=32
        )
        for i, e in enumerate(entities):
            if e not in PII_ENTITIES:
                raise GatewayConfigError(
                    f"{f.at('entities')}[{i}]",
                    f"unknown entity {e!r} (one of {', '.join(PII_ENTITIES)})",
                )
        return pii_scanner(tuple(dict.fromkeys(entities))), None, None
    if kind == "secrets":
        return secrets_scanner(), None, None
    if kind == "invisible":
        return invisible_scanner(), None, None
    if kind == "injection":
        return injection_scanner(), None, None
    if kind == "length":
        return None, f.integer("max_chars", None, 1, MAX_SCAN_CHARS), None
    return None, None, _classifier(f)


def _regex(f: Fields) -> regex.Pattern[str]:
    """Valid for the stdlib `re` (its parser runs the nested-repeat check and the stream's
    pattern analysis) and compiled with `regex` (what matches)."""
    source = f.text("pattern", max_len=MAX_PATTERN_CHARS)
    try:
        re.compile(source)
        pattern = regex.compile(source)
    except (re.error, regex.error) as e:
        raise GatewayConfigError(
            f.at("pattern"), f"rule {f.raw.get('name')!r}: bad regex: {e}"
        ) from None
    problem = nested_repeat_problem(source)
    if problem:
        raise GatewayConfigError(f.at("pattern"), f"rule {f.raw.get('name')!r}: {problem}")
    if pattern.match(""):
        raise GatewayConfigError(
            f.at("pattern"), f"rule {f.raw.get('name')!r}: matches the empty string"
        )
    return pattern


def _classifier(f: Fields) -> ClassifierSpec:
    prompt = f.text("prompt", max_len=20_000)
    if "{text}" not in prompt:
        raise GatewayConfigError(f.at("prompt"), "must contain {text}")
    positive = f.text("positive", max_len=64).strip().lower()
    threshold = f.number("threshold", 0.5, 0.0, 1.0)
    on_error = f.choice("on_error", "allow", ("allow", "block"))
    timeout = f.number("timeout_s", 10.0, 0.01, 300.0)
    return ClassifierSpec(
        prompt, positive, threshold, Action.BLOCK if on_error == "block" else Action.AUDIT, timeout
    )
