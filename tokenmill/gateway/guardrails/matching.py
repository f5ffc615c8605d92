"""Run rules over a text and apply redaction masks: shared by whole-text and stream checks."""

from __future__ import annotations

from tokenmill.gateway.guardrails.decision import Action, Decision, Span, Stage
from tokenmill.gateway.guardrails.rule import Rule

# The pseudo-rule that blocks user text too long to scan (`max_scan_chars`).
SCAN_LIMIT_RULE = "(max_scan_chars)"

Hit = tuple[Rule, Span]


def find_hits(rules: tuple[Rule, ...], text: str, pos: int = 0) -> list[Hit]:
    """All pattern-rule spans in `text` from `pos`, by start then longest."""
    hits = [(r, s) for r in rules if r.scanner is not None for s in r.scanner.scan(text, pos)]
    hits.sort(key=lambda h: (h[1].start, -h[1].end))
    return hits


def decision(rule: Rule, stage: Stage, span: Span, offset: int = 0, index: int = 0) -> Decision:
    return Decision(
        rule.name,
        stage,
        rule.action,
        span.label,
        span.matched_text,
        span.start + offset,
        span.end + offset,
        index,
    )


def length_decision(rule: Rule, stage: Stage, length: int, index: int = 0) -> Decision | None:
    assert rule.max_chars is not None
    if length <= rule.max_chars:
        return None
    return Decision(
        rule.name, stage, rule.action, f"length>{rule.max_chars}", "", rule.max_chars, length, index
    )


def mask(text: str, hits: list[Hit], offset: int = 0) -> str:
    """`text` with each run of overlapping redact spans replaced by its first span's mask.
    Span offsets are `offset` ahead of `text` (its position in a longer text)."""
    pieces: list[str] = []
    at = 0  # in text
    run_end = -1
    for rule, span in hits:
        if rule.action is not Action.REDACT:
            continue
        start, end = span.start - offset, span.end - offset
        if start < run_end:  # overlaps the current run: extend it
            run_end = max(run_end, end)
            at = run_end
            continue
        pieces.append(text[at:start])
        pieces.append(rule.mask_for(span.label))
        at = run_end = end
    if not pieces:
        return text
    pieces.append(text[at:])
    return "".join(pieces)
