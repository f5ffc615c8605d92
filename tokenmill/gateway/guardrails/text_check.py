"""`check_text`: every deterministic rule of a stage over one whole text."""

from __future__ import annotations

from dataclasses import dataclass

from tokenmill.gateway.guardrails.decision import Action, Decision, Stage, strongest
from tokenmill.gateway.guardrails.matching import (
    SCAN_LIMIT_RULE,
    decision,
    find_hits,
    length_decision,
    mask,
)
from tokenmill.gateway.guardrails.rule import GuardrailsConfig


@dataclass(frozen=True)
class TextVerdict:
    decisions: tuple[Decision, ...]
    text: str  # redacted; the very same object when nothing was redacted
    stop: Decision | None  # the governing block or fallback decision, if any

    @property
    def blocked(self) -> Decision | None:
        return self.stop if self.stop and self.stop.action is Action.BLOCK else None

    @property
    def fallback(self) -> Decision | None:
        return self.stop if self.stop and self.stop.action is Action.FALLBACK else None


def check_text(
    config: GuardrailsConfig, stage: Stage | str, text: str, index: int = 0
) -> TextVerdict:
    """Regex-like scanners and length rules; classifiers are not run here (see check_input).
    Text longer than `config.max_scan_chars` is not scanned: it is blocked."""
    stage = Stage(stage)
    if len(text) > config.max_scan_chars:
        limit = Decision(
            SCAN_LIMIT_RULE,
            stage,
            Action.BLOCK,
            "scan_limit",
            "",
            config.max_scan_chars,
            len(text),
            index,
        )
        return TextVerdict((limit,), text, limit)
    rules = config.rules_for(stage)
    hits = find_hits(rules, text)
    decisions = [decision(r, stage, s, index=index) for r, s in hits]
    for rule in rules:
        if rule.max_chars is not None and (d := length_decision(rule, stage, len(text), index)):
            decisions.append(d)
    stops = [d for d in decisions if d.action in (Action.BLOCK, Action.FALLBACK)]
    return TextVerdict(tuple(decisions), mask(text, hits), strongest(stops))
