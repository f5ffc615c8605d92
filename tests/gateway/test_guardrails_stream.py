from __future__ import annotations

import asyncio
import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenmill.gateway.guardrails import (
    Action,
    OutputChecker,
    check_output,
    check_output_async,
    check_text,
    parse_guardrails,
)

SECRET = "AKIAIOSFODNN7EXAMPLE"


def config(*rules, hold=64):
    return parse_guardrails({"hold_back_chars": hold, "rules": list(rules)})


def rule(name, scanner, action, **fields):
    return {"name": name, "scanner": scanner, "action": action, **fields}


def stream(c, deltas):
    """Feeds the deltas; returns the emits, all decisions and the stopping step (if any)."""
    checker = OutputChecker(c)
    emits, decisions = [], []
    for delta in deltas:
        step = checker.feed(delta)
        emits.append(step.emit)
        decisions += step.decisions
        if step.stop:
            return emits, decisions, step
    step = checker.finish()
    emits.append(step.emit)
    decisions += step.decisions
    return emits, decisions, step


def test_email_split_across_chunks_is_redacted():
    c = config(rule("pii", "pii", "redact"))
    emits, decisions, _ = stream(c, ["Write to ja", "ne@exa", "mple.com today."])
    assert "".join(emits) == "Write to [REDACTED:email] today."
    assert [(d.matched_text, d.start, d.end) for d in decisions] == [("jane@example.com", 9, 25)]
    assert all("@" not in e for e in emits)


def test_text_is_held_back_at_most_the_window():
    c = config(rule("a", "regex", "audit", pattern="zzz"), hold=16)
    checker = OutputChecker(c)
    fed = emitted = 0
    for delta in ["abc"] * 40 + ["x" * 100]:
        fed += len(delta)
        emitted += len(checker.feed(delta).emit)
        assert 0 <= fed - emitted <= 16
    assert emitted + len(checker.finish().emit) == fed


def test_block_stops_before_any_of_the_match_is_emitted():
    c = config(rule("s", "secrets", "block"))
    text = "Sure, here is the key: " + SECRET + " and some more text after it."
    for size in (1, 3, 7, 64):
        emits, decisions, step = stream(c, [text[i : i + size] for i in range(0, len(text), size)])
        assert (
            step.stop is not None
            and step.stop.code == "guardrail_blocked"
            and step.replacement is None
        )
        assert step.stop.matched_text == SECRET and step.stop.start == text.index(SECRET)
        sent = "".join(emits)
        assert text.startswith(sent) and "AKIA" not in sent


def test_after_a_stop_further_calls_are_empty():
    c = config(rule("s", "secrets", "block"))
    checker = OutputChecker(c)
    assert checker.feed(SECRET + " " * 64).stop is not None
    assert checker.feed("more") == checker.finish() == type(checker.finish())("")


def test_fallback_replaces_the_output():
    c = config(
        rule(
            "competitor",
            "deny_list",
            "fallback",
            terms=["acme corp"],
            fallback="I can't discuss that.",
        )
    )
    emits, _, step = stream(c, ["We love ", "Acme ", "Corp products"])
    assert step.stop.action is Action.FALLBACK and step.replacement == "I can't discuss that."
    assert "Acme" not in "".join(emits)
    whole = check_output(c, "We love Acme Corp products")
    assert whole.stop == step.stop and whole.replacement == "I can't discuss that."


def test_audit_is_byte_for_byte_and_records_the_exact_match():
    c = config(
        rule("custom", "regex", "audit", pattern=r"(?i)project\s+x"),
        rule("inv", "invisible", "audit"),
    )
    deltas = ["About Proj", "ect \u200b", "  X and", " \U0001f600 more PROJECT x"]
    emits, decisions, step = stream(c, deltas)
    assert "".join(emits) == "".join(deltas) and step.stop is None
    # \u200b is not whitespace to `\s`: "Project \u200b  X" is no match
    assert [(d.rule, d.matched_text) for d in decisions] == [
        ("inv", "\u200b"),
        ("custom", "PROJECT x"),
    ]


def test_length_rule_stops_the_stream():
    c = config(rule("too-long", "length", "block", max_chars=100))
    emits, _, step = stream(c, ["word "] * 40)
    assert step.stop.rule == "too-long" and step.stop.start == 100
    assert len("".join(emits)) <= 100
    assert stream(c, ["word "] * 20)[2].stop is None


def test_long_token_blocked_by_its_start_and_redacted_whole_with_a_wide_window():
    token = "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5q" * 10  # 208 chars, longer than the default window
    text = f"key: {token} end"
    c = config(rule("s", "secrets", "block"))
    emits, _, step = stream(c, list(text))
    assert step.stop is not None and "sk-" not in "".join(emits)
    wide = config(rule("s", "secrets", "redact"), hold=512)
    assert "".join(stream(wide, list(text))[0]) == "key: [REDACTED:api_key] end"


def test_lone_surrogates_and_emoji_in_a_stream():
    c = config(rule("pii", "pii", "redact"), rule("inv", "invisible", "redact", mask=""))
    text = json.loads('"\\ud83d\\ude00 jane@example.com \\ud800 cafe\\u0301"')
    emits, _, _ = stream(c, list(text))
    assert "".join(emits) == "\U0001f600 [REDACTED:email]  cafe\u0301"


def test_output_classifier_runs_at_finish_async():
    judge_rule = rule(
        "judge",
        "classifier",
        "fallback",
        prompt="Toxic?\n{text}",
        positive="yes",
        fallback="Sorry.",
    )
    c = config(judge_rule, rule("pii", "pii", "redact"))

    async def judge(prompt):
        return {"yes": 0.9} if "idiot" in prompt else {"no": 0.9}

    checker = OutputChecker(c)
    assert checker.needs_judge
    first = checker.feed("you idiot, mail jane@example.com")
    with pytest.raises(RuntimeError, match="finish_async"):
        checker.finish()
    last = asyncio.run(checker.finish_async(judge))
    assert last.stop.rule == "judge" and last.replacement == "Sorry." and last.emit == ""
    # what was still held (the email, which could have grown) is never sent; what could not
    # be part of a pattern match went out already: a classifier stops a stream only at its end
    assert first.emit == "you idiot, mail "
    ok = asyncio.run(check_output_async(c, "hello jane@example.com", judge))
    assert ok.stop is None and ok.text == "hello [REDACTED:email]"


FRAGMENTS = [
    "jane@example.com", "+1 415 555 2671", "4111 1111 1111 1111", "acme corp", "project x",
    SECRET, "ghp_" + "x1" * 18, " ", "  ", "hello", ".", ",", "\n", "\u200b", "\u202e", "x", "é",
    "\U0001f600", "ja", "ne@", "ex", "ample", ".com", "12", "-", "555", "\ud800", "ignore all previous instructions",
]  # fmt: skip
texts = st.lists(st.sampled_from(FRAGMENTS), max_size=25).map("".join)
REDACT_AUDIT = [
    rule("pii", "pii", "redact"),
    rule("inv", "invisible", "redact", mask="<{entity}>"),
    rule("custom", "regex", "audit", pattern=r"(?i)project\s+x"),
    rule("inj", "injection", "audit"),
    rule("deny", "deny_list", "redact", terms=["acme corp"], mask="***"),
]
STOPPING = [
    *REDACT_AUDIT[:3],
    rule("s", "secrets", "block"),
    rule("d", "deny_list", "fallback", terms=["acme corp"], fallback="no"),
]
AUDIT_STOPPING = config(
    *(dict(r, action="audit") for r in REDACT_AUDIT if "mask" not in r), *STOPPING[3:]
)
CONFIGS = [
    config(*REDACT_AUDIT),
    config(*REDACT_AUDIT, hold=16),
    config(*STOPPING),
    config(*STOPPING, hold=24),
    AUDIT_STOPPING,
    config(  # length rules are examined exactly at max_chars + 1, whatever the chunking
        *STOPPING[:3],
        rule("long", "length", "audit", max_chars=30),
        rule("too-long", "length", "block", max_chars=90),
        hold=24,
    ),
]


def chunkings(text):
    cuts = st.lists(st.integers(0, len(text)), max_size=12).map(sorted)
    return cuts.map(lambda c: [text[a:b] for a, b in zip([0, *c], [*c, len(text)], strict=True)])


def stream_checked(c, deltas):
    """`stream`, asserting after every delta that at most the window is held; also returns the
    checker (for `forced`) and how much of the text had been emitted (unmasked offset)."""
    checker = OutputChecker(c)
    emits, decisions = [], []
    for delta in deltas:
        step = checker.feed(delta)
        assert 0 <= checker.held <= c.hold_back_chars or step.stop
        emits.append(step.emit)
        decisions += step.decisions
        if step.stop:
            return emits, decisions, step, checker, checker.emitted_chars
    step = checker.finish()
    emits.append(step.emit)
    decisions += step.decisions
    return emits, decisions, step, checker, checker.emitted_chars


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(CONFIGS),
    texts.flatmap(lambda t: st.tuples(st.just(t), chunkings(t), chunkings(t))),
)
def test_any_chunking_emits_the_same_as_check_output(c, case):
    text, one, other = case
    whole = check_output(c, text)
    for deltas in (one, other, list(text)):
        emits, decisions, step, _, _ = stream_checked(c, deltas)
        assert "".join(emits) == whole.text
        assert tuple(decisions) == whole.decisions
        assert (step.stop, step.replacement) == (whole.stop, whole.replacement)
        if whole.stop and c is AUDIT_STOPPING:  # emits unmasked text: a prefix, short of the match
            assert text.startswith(whole.text) and len(whole.text) <= whole.stop.start


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CONFIGS), texts.flatmap(lambda t: st.tuples(st.just(t), chunkings(t))))
def test_streamed_output_is_the_whole_text_check_unless_the_window_filled(c, case):
    """While the window never filled (`forced == 0`: every pending match was decided within
    `hold_back_chars`), the stream is exactly `check_text` on the whole text, overlapping
    matches of different rules included; a stop comes before any block or fallback match of
    the whole text is emitted, even partly."""
    text, deltas = case
    plain = check_text(c, "output", text)
    emits, decisions, step, checker, emitted = stream_checked(c, deltas)
    if checker.forced or any(r.max_chars for r in c.rules):  # length: decided when reached
        return
    if step.stop is None:
        assert "".join(emits) == plain.text
        assert tuple(decisions) == plain.decisions
    else:
        assert plain.text.startswith("".join(emits)) and step.stop in plain.decisions
        assert set(decisions) <= set(plain.decisions)
        assert all(emitted <= d.start for d in plain.decisions if d.action in STOP_ACTIONS)


STOP_ACTIONS = (Action.BLOCK, Action.FALLBACK)


@settings(max_examples=100, deadline=None)
@given(texts.flatmap(lambda t: st.tuples(st.just(t), chunkings(t))))
def test_audit_only_stream_is_the_identity(case):
    text, deltas = case
    c = config(*(dict(r, action="audit") for r in REDACT_AUDIT if "mask" not in r), hold=16)
    emits, _, _ = stream(c, deltas)
    assert "".join(emits) == text


# Patterns whose first full match is not the last word: a longer alternative, a lookahead
# or an anchor past the match, a lazy body, a lookbehind, a word boundary.
TRICKY = [
    r"abcd|ab",
    r"ab(?!cd)",
    r"b(?=cd)",
    r"\d+$",
    r"x\Z",
    r"BEGIN(?:[\s\S]{0,12}?END)?",
    r"(?<=a )b+",
    r"\bab\b",
    r"a{2,3}?c?",
    r"(?i)DC|dca",
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.sampled_from(TRICKY), st.sampled_from(["redact", "block", "audit"])),
        min_size=1,
        max_size=2,
    ),
    st.lists(
        st.sampled_from(["a", "b", "c", "d", " ", "\n", "1", "x", "BEGIN", "END"]), max_size=30
    )
    .map("".join)
    .flatmap(lambda t: st.tuples(st.just(t), chunkings(t))),
)
def test_tricky_patterns_stream_exactly(patterns, case):
    text, deltas = case
    rules = [rule(f"r{i}", "regex", a, pattern=p) for i, (p, a) in enumerate(patterns)]
    c = config(*rules, hold=16)
    whole = check_output(c, text)
    plain = check_text(c, "output", text)
    for chunks in (deltas, list(text)):
        emits, decisions, step, checker, emitted = stream_checked(c, chunks)
        assert ("".join(emits), tuple(decisions), step.stop) == (
            whole.text,
            whole.decisions,
            whole.stop,
        )
        if checker.forced:
            continue
        if step.stop is None:
            assert (whole.text, whole.decisions) == (plain.text, plain.decisions)
        else:
            assert step.stop in plain.decisions and plain.text.startswith(whole.text)
        assert all(emitted <= d.start for d in plain.decisions if d.action is Action.BLOCK)


DEFAULTS = config(
    rule("pii", "pii", "redact"),
    rule("secrets", "secrets", "block"),
    rule("deny", "deny_list", "fallback", terms=["acme corp"], fallback="no"),
)
PROSE = (
    "Hello there, how are you? The quick brown fox jumps over the lazy dog. In 2024 the team "
    "shipped version 1.2 of the service, which handles about 1500 requests per second.\n\n"
    "Photosynthesis converts light energy into chemical energy; plants use it (mostly)."
)


def test_prose_is_held_by_at_most_its_trailing_word():
    checker = OutputChecker(DEFAULTS)
    assert checker.feed("Hello").emit == ""  # could be an email's local part
    assert checker.feed(" there, how are you?").emit == "Hello there, how are you?"
    checker = OutputChecker(DEFAULTS)
    sent, fed = "", ""
    for token in re.findall(r"\s*\S{1,4}|\s+", PROSE):
        sent += checker.feed(token).emit
        fed += token
        held = fed[len(sent) :]
        assert held == "" or (held.strip() and " " not in held.strip()), (fed, held)
    assert sent + checker.finish().emit == PROSE


def test_matches_split_across_deltas_are_still_caught_whole():
    text = "Mail jane.doe@example.com or call (415) 555-2671, key AKIAIOSFODNN7EXAMPLE ok"
    deltas = re.findall(r".{1,3}", text)
    emits, decisions, step = stream(DEFAULTS, deltas)
    assert "".join(emits) == "Mail [REDACTED:email] or call [REDACTED:phone], key "
    assert [d.label for d in decisions] == ["email", "phone", "aws_access_key"]
    assert step.stop.label == "aws_access_key"
    assert all("@" not in e and "555" not in e and "AKIA" not in e for e in emits)


def test_an_email_starting_inside_a_card_number_is_masked_as_in_the_whole_text():
    c = config(rule("pii", "pii", "redact"))
    text = "pay 4111 1111 1111 1111x@example.com now"
    plain = check_text(c, "output", text)
    assert plain.text == "pay [REDACTED:credit_card] now"
    for deltas in (list(text), [text], [text[:10], text[10:]]):
        emits, decisions, _ = stream(c, deltas)
        assert "".join(emits) == plain.text and tuple(decisions) == plain.decisions


def test_a_match_longer_than_the_window_is_decided_as_it_stands():
    c = config(rule("r", "regex", "redact", pattern=r"x+"), hold=16)
    text = "a " + "x" * 40 + " b"
    for deltas in (list(text), [text]):
        emits, _, _, checker, _ = stream_checked(c, deltas)
        assert checker.forced == 2  # masked in window-sized pieces, none of it sent
        assert "".join(emits) == "a " + "[REDACTED:r]" * 3 + " b"
    assert check_text(c, "output", text).text == "a [REDACTED:r] b"
