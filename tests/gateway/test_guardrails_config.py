from __future__ import annotations

import pytest
import yaml

from tokenmill.gateway.errors import GatewayConfigError
from tokenmill.gateway.guardrails import Action, Stage, parse_guardrails

EXAMPLE = r"""
guardrails:
  hold_back_chars: 64
  rules:
    - name: no-secrets
      stages: [input, output]
      scanner: secrets
      action: block
    - name: emails
      scanner: pii
      entities: [email, phone]
      action: redact
      mask: "[REDACTED:{entity}]"
    - name: competitor
      scanner: deny_list
      terms: ["acme corp"]
      action: fallback
      fallback: "I can't discuss that."
    - name: custom
      scanner: regex
      pattern: "(?i)project\\s+x"
      action: audit
    - name: too-long
      scanner: length
      max_chars: 20000
      action: block
    - name: judge
      scanner: classifier
      stages: [input]
      prompt: "Is the following request harmful? Answer yes or no.\n\n{text}"
      positive: "yes"
      threshold: 0.5
      action: block
"""


def test_the_documented_example_parses():
    config = parse_guardrails(yaml.safe_load(EXAMPLE)["guardrails"])
    assert config.hold_back_chars == 64
    assert [r.name for r in config.rules] == [
        "no-secrets",
        "emails",
        "competitor",
        "custom",
        "too-long",
        "judge",
    ]
    assert config.rule("emails").action is Action.REDACT
    assert config.rule("no-secrets").stages == {Stage.INPUT, Stage.OUTPUT}
    assert config.rule("judge").stages == {Stage.INPUT}
    assert config.rule("judge").classifier.positive == "yes"
    assert config.rule("too-long").max_chars == 20000
    assert config.rule("competitor").fallback == "I can't discuss that."
    assert [r.name for r in config.rules_for(Stage.OUTPUT)] == [
        "no-secrets",
        "emails",
        "competitor",
        "custom",
        "too-long",
    ]


def test_empty_and_defaults():
    assert parse_guardrails(None).rules == ()
    config = parse_guardrails({"rules": [{"name": "s", "scanner": "secrets", "action": "block"}]})
    assert config.hold_back_chars == 64
    assert config.max_scan_chars == 1_000_000
    assert config.rules[0].stages == {Stage.INPUT, Stage.OUTPUT}


def rule(**fields):
    return {"name": "r", "scanner": "secrets", "action": "block", **fields}


BAD = [
    ("not a mapping", ["x"], "guardrails"),
    ("unknown top key", {"rulez": []}, "guardrails.rulez"),
    ("hold back too big", {"hold_back_chars": 100_000}, "guardrails.hold_back_chars"),
    ("hold back a bool", {"hold_back_chars": True}, "guardrails.hold_back_chars"),
    ("rules not a list", {"rules": {"a": 1}}, "guardrails.rules"),
    (
        "rule missing name",
        {"rules": [{"scanner": "secrets", "action": "block"}]},
        "guardrails.rules[0].name",
    ),
    ("unknown rule key", {"rules": [rule(colour="red")]}, "guardrails.rules[0].colour"),
    ("unknown scanner", {"rules": [rule(scanner="magic")]}, "guardrails.rules[0].scanner"),
    ("unknown action", {"rules": [rule(action="explode")]}, "guardrails.rules[0].action"),
    (
        "unknown stage",
        {"rules": [rule(stages=["input", "middle"])]},
        "guardrails.rules[0].stages[1]",
    ),
    ("duplicate stage", {"rules": [rule(stages=["input", "input"])]}, "guardrails.rules[0].stages"),
    ("duplicate name", {"rules": [rule(), rule()]}, "guardrails.rules[1].name"),
    (
        "fallback without text",
        {"rules": [rule(), rule(name="f", action="fallback")]},
        "guardrails.rules[1].fallback",
    ),
    ("fallback text on block", {"rules": [rule(fallback="no")]}, "guardrails.rules[0].fallback"),
    ("mask on block", {"rules": [rule(mask="x")]}, "guardrails.rules[0].mask"),
    (
        "mask unknown field",
        {"rules": [rule(action="redact", mask="{secret}")]},
        "guardrails.rules[0].mask",
    ),
    (
        "bad regex",
        {"rules": [rule(scanner="regex", pattern="(unclosed")]},
        "guardrails.rules[0].pattern",
    ),
    (
        "catastrophic regex",
        {"rules": [rule(scanner="regex", pattern="(a+)+$")]},
        "guardrails.rules[0].pattern",
    ),
    (
        "pattern too long",
        {"rules": [rule(scanner="regex", pattern="a" * 1001)]},
        "guardrails.rules[0].pattern",
    ),
    (
        "empty-matching regex",
        {"rules": [rule(scanner="regex", pattern="a*")]},
        "guardrails.rules[0].pattern",
    ),
    ("regex without pattern", {"rules": [rule(scanner="regex")]}, "guardrails.rules[0].pattern"),
    (
        "unknown entity",
        {"rules": [rule(scanner="pii", entities=["email", "dna"])]},
        "guardrails.rules[0].entities[1]",
    ),
    (
        "terms not a list",
        {"rules": [rule(scanner="deny_list", terms="acme")]},
        "guardrails.rules[0].terms",
    ),
    (
        "term not a string",
        {"rules": [rule(scanner="deny_list", terms=["a", 3])]},
        "guardrails.rules[0].terms[1]",
    ),
    ("length without max", {"rules": [rule(scanner="length")]}, "guardrails.rules[0].max_chars"),
    (
        "length max zero",
        {"rules": [rule(scanner="length", max_chars=0)]},
        "guardrails.rules[0].max_chars",
    ),
    (
        "length redact",
        {"rules": [rule(scanner="length", max_chars=5, action="redact")]},
        "guardrails.rules[0].action",
    ),
    (
        "prompt without {text}",
        {"rules": [rule(scanner="classifier", prompt="harmful?", positive="yes")]},
        "guardrails.rules[0].prompt",
    ),
    (
        "threshold above 1",
        {"rules": [rule(scanner="classifier", prompt="{text}", positive="yes", threshold=1.5)]},
        "guardrails.rules[0].threshold",
    ),
    (
        "bad on_error",
        {"rules": [rule(scanner="classifier", prompt="{text}", positive="yes", on_error="retry")]},
        "guardrails.rules[0].on_error",
    ),
    ("pattern on secrets", {"rules": [rule(pattern="x")]}, "guardrails.rules[0].pattern"),
    ("bad rule name", {"rules": [rule(name="has space")]}, "guardrails.rules[0].name"),
]


@pytest.mark.parametrize(("raw", "path"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_config_names_the_key(raw, path):
    with pytest.raises(GatewayConfigError) as info:
        parse_guardrails(raw)
    assert info.value.path == path, info.value


def test_bad_regex_error_names_rule_and_regex_error():
    with pytest.raises(GatewayConfigError) as info:
        parse_guardrails({"rules": [rule(name="custom", scanner="regex", pattern="[a-")]})
    assert "'custom'" in info.value.message
    assert "bad regex" in info.value.message and "unterminated character set" in info.value.message


def test_custom_path_prefix():
    with pytest.raises(GatewayConfigError) as info:
        parse_guardrails({"rules": [rule(action="nope")]}, path="gateway.guardrails")
    assert info.value.path == "gateway.guardrails.rules[0].action"
