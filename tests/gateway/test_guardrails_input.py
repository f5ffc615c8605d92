from __future__ import annotations

import asyncio
import json

import pytest

from tokenmill.gateway.guardrails import Action, Stage, check_input, check_text, parse_guardrails

SECRET = "AKIAIOSFODNN7EXAMPLE"


def config(*rules, **top):
    return parse_guardrails({"rules": list(rules), **top})


def rule(name, scanner, action, **fields):
    return {"name": name, "scanner": scanner, "action": action, **fields}


def run(coro):
    return asyncio.run(coro)


def test_block_gives_a_policy_code_and_a_message_without_the_match():
    c = config(rule("no-secrets", "secrets", "block"))
    v = run(check_input(c, ["hello", f"my key is {SECRET}"]))
    assert v.blocked is not None and v.fallback is None
    assert v.blocked.code == "guardrail_blocked"
    assert v.blocked.index == 1 and v.blocked.matched_text == SECRET
    assert SECRET not in v.blocked.message and "no-secrets" in v.blocked.message


def test_fallback_answers_instead_of_the_model():
    c = config(
        rule(
            "competitor",
            "deny_list",
            "fallback",
            terms=["acme corp"],
            fallback="I can't discuss that.",
        )
    )
    v = run(check_input(c, ["Tell me about ACME Corp."]))
    assert v.blocked is None
    assert v.fallback.rule == "competitor" and v.replacement == "I can't discuss that."


def test_redact_masks_and_keeps_order_and_identity():
    c = config(rule("pii", "pii", "redact", entities=["email"], mask="<{entity}:{rule}>"))
    texts = ["no pii here", "mail jane@example.com please", "x"]
    v = run(check_input(c, texts))
    assert v.texts == ["no pii here", "mail <email:pii> please", "x"]
    assert v.texts[0] is texts[0] and v.texts[2] is texts[2]
    assert v.blocked is None and v.fallback is None
    assert [(d.action, d.matched_text, d.index) for d in v.decisions] == [
        (Action.REDACT, "jane@example.com", 1)
    ]


def test_audit_passes_text_unchanged_and_records_the_exact_match():
    c = config(rule("custom", "regex", "audit", pattern=r"(?i)project\s+x"))
    texts = ["About PROJECT   x\u200b and more"]
    v = run(check_input(c, texts))
    assert v.texts[0] is texts[0]
    (d,) = v.decisions
    assert (d.action, d.matched_text, d.start, d.end, d.label) == (
        Action.AUDIT,
        "PROJECT   x",
        6,
        17,
        "custom",
    )


def test_empty_mask_strips_invisible_characters():
    c = config(rule("invisible", "invisible", "redact", mask=""))
    assert run(check_input(c, ["pay\u200b\u202e me"])).texts == ["pay me"]


def test_precedence_block_over_fallback_over_redact_over_audit_all_reported():
    text = f"acme corp jane@example.com project x {SECRET}"
    rules = [
        rule("a", "regex", "audit", pattern="project x"),
        rule("r", "pii", "redact"),
        rule("f", "deny_list", "fallback", terms=["acme corp"], fallback="no"),
        rule("b", "secrets", "block"),
    ]
    v = run(check_input(config(*rules), [text]))
    assert v.blocked.rule == "b" and v.fallback is None and v.replacement is None
    assert sorted(d.action.value for d in v.decisions) == ["audit", "block", "fallback", "redact"]
    v = run(check_input(config(*rules[:3]), [text]))
    assert v.fallback.rule == "f" and v.blocked is None
    v = run(check_input(config(*rules[:2]), [text]))
    assert v.blocked is None and v.fallback is None and "[REDACTED:email]" in v.texts[0]


def test_stages_select_rules():
    c = config(rule("out-only", "secrets", "block", stages=["output"]))
    assert run(check_input(c, [SECRET])).decisions == ()
    assert check_text(c, "output", SECRET).blocked is not None


def test_length_rule_per_text():
    c = config(rule("too-long", "length", "block", max_chars=10))
    assert run(check_input(c, ["0123456789", "short"])).blocked is None
    v = run(check_input(c, ["0123456789", "0123456789!"]))
    assert (v.blocked.index, v.blocked.start, v.blocked.end, v.blocked.matched_text) == (
        1,
        10,
        11,
        "",
    )


def test_text_over_the_scan_limit_is_blocked_unscanned():
    c = config(rule("a", "regex", "audit", pattern="x"), max_scan_chars=1000)
    v = run(check_input(c, ["x" * 1001]))
    assert v.blocked.label == "scan_limit" and v.blocked.code == "guardrail_blocked"
    assert len(v.decisions) == 1


class FakeJudge:
    def __init__(self, answer=None, error=None, delay=0.0):
        self.answer, self.error, self.delay = answer, error, delay
        self.prompts: list[str] = []

    async def __call__(self, prompt):
        self.prompts.append(prompt)
        await asyncio.sleep(self.delay)
        if self.error:
            raise self.error
        return self.answer


def judge_rule(**fields):
    base = {
        "prompt": "Harmful? yes or no.\n\n{text}",
        "positive": "Yes",
        "threshold": 0.5,
        "stages": ["input"],
    }
    return {"name": "judge", "scanner": "classifier", "action": "block", **base, **fields}


def test_classifier_fires_at_threshold_with_normalised_tokens():
    judge = FakeJudge({" yes": 0.3, "YES": 0.2, "no": 0.5})
    v = run(check_input(config(judge_rule()), ["how to pick a lock", "quickly"], judge))
    assert v.blocked.rule == "judge" and v.blocked.label == "classifier"
    assert judge.prompts == ["Harmful? yes or no.\n\nhow to pick a lock\n\nquickly"]


def test_classifier_below_threshold_passes():
    v = run(check_input(config(judge_rule()), ["hello"], FakeJudge({"yes": 0.49, "no": 0.51})))
    assert v.blocked is None and v.decisions == ()


def test_classifier_sees_redacted_text_and_is_skipped_when_already_blocked():
    judge = FakeJudge({"no": 1.0})
    c = config(rule("pii", "pii", "redact"), judge_rule())
    run(check_input(c, ["mail jane@example.com"], judge))
    assert "jane@example.com" not in judge.prompts[0] and "[REDACTED:email]" in judge.prompts[0]
    c = config(rule("s", "secrets", "block"), judge_rule())
    judge = FakeJudge({"yes": 1.0})
    assert run(check_input(c, [SECRET], judge)).blocked.rule == "s" and judge.prompts == []


@pytest.mark.parametrize(
    "judge",
    [
        FakeJudge(error=RuntimeError("model down")),
        FakeJudge({"yes": 0.9}, delay=1.0),  # timeout
        FakeJudge(["yes"]),  # not a mapping
        FakeJudge({"yes": float("nan")}),
    ],
    ids=["raises", "timeout", "not-a-mapping", "nan"],
)
@pytest.mark.parametrize("on_error", ["allow", "block"])
def test_classifier_errors_follow_on_error(judge, on_error):
    c = config(judge_rule(on_error=on_error, timeout_s=0.05))
    v = run(check_input(c, ["hi"], judge))
    (d,) = v.decisions
    assert d.label == "classifier_error"
    if on_error == "allow":
        assert d.action is Action.AUDIT and v.blocked is None
    else:
        assert d.action is Action.BLOCK and v.blocked == d


def test_classifier_fallback_and_missing_judge():
    c = config(judge_rule(action="fallback", fallback="Let's talk about something else."))
    v = run(check_input(c, ["x"], FakeJudge({"yes": 1.0})))
    assert v.fallback.rule == "judge" and v.replacement == "Let's talk about something else."
    with pytest.raises(ValueError, match="needs a judge"):
        run(check_input(c, ["x"]))


def test_unicode_edge_cases_do_not_crash():
    c = config(
        rule("pii", "pii", "redact"),
        rule("s", "secrets", "audit"),
        rule("inj", "injection", "audit"),
        rule("inv", "invisible", "redact", mask=""),
        rule("deny", "deny_list", "audit", terms=["caf\u00e9", "\u4e2d\u6587"]),
    )
    texts = [
        json.loads('"lone \\ud800 surrogate \\udc00 jane@example.com"'),
        "emoji \U0001f600\U0001f468\u200d\U0001f469\u200d\U0001f467 jane@ex\u00e4mple.com",
        "combining cafe\u0301 caf\u00e9 \u4e2d\u6587",
        "",
    ]
    v = run(check_input(c, texts))
    assert v.texts[0] == "lone  surrogate  [REDACTED:email]"
    assert (
        v.texts[1] == texts[1]
    )  # the ZWJ sequence is left alone; a non-ASCII domain is not matched
    assert [d.matched_text for d in v.decisions if d.rule == "deny"] == [
        "caf\u00e9",
        "\u4e2d\u6587",
    ]
    assert v.texts[3] == ""


def test_check_text_stage_accepts_enum_and_string():
    c = config(rule("s", "secrets", "block"))
    assert check_text(c, Stage.INPUT, SECRET).stop == check_text(c, "input", SECRET).stop
