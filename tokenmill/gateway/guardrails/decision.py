"""What a rule decided about a stretch of text: the record the ledger and metrics count."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Stage(StrEnum):
    INPUT = "input"
    OUTPUT = "output"


class Action(StrEnum):
    BLOCK = "block"
    FALLBACK = "fallback"
    REDACT = "redact"
    AUDIT = "audit"

    @property
    def rank(self) -> int:
        """Precedence when several rules fire: lower wins (block > fallback > redact > audit)."""
        return _RANK[self]


_RANK = {Action.BLOCK: 0, Action.FALLBACK: 1, Action.REDACT: 2, Action.AUDIT: 3}

# A policy code per action, for the caller's error body / stream error event and metrics.
POLICY_CODES = {
    Action.BLOCK: "guardrail_blocked",
    Action.FALLBACK: "guardrail_fallback",
    Action.REDACT: "guardrail_redacted",
    Action.AUDIT: "guardrail_audit",
}


@dataclass(frozen=True, slots=True)
class Span:
    """A scanner's match: `text[start:end] == matched_text`, `label` names what it is."""

    start: int
    end: int
    matched_text: str
    label: str


@dataclass(frozen=True, slots=True)
class Decision:
    """One rule firing. Offsets are into the checked text; `index` is which input text (0 for
    output). `matched_text` is exact: keep it out of client-facing messages (see `message`)."""

    rule: str
    stage: Stage
    action: Action
    label: str
    matched_text: str
    start: int
    end: int
    index: int = 0

    @property
    def code(self) -> str:
        return POLICY_CODES[self.action]

    @property
    def message(self) -> str:
        """Safe for clients: names the rule and the kind of match, never the matched text."""
        what = "request" if self.stage is Stage.INPUT else "response"
        verb = {Action.BLOCK: "blocked", Action.FALLBACK: "replaced"}.get(self.action, "flagged")
        return f"The {what} was {verb} by guardrail policy '{self.rule}' ({self.label})."


def masked(text: str) -> str:
    """What the ledger keeps of a match: its length and, for 8 characters or more, its first
    and last character (`j…m (20 chars)`), never the text a rule redacted or blocked."""
    n = len(text)
    return f"{text[0]}…{text[-1]} ({n} chars)" if n >= 8 else f"… ({n} chars)"


def strongest(decisions: list[Decision] | tuple[Decision, ...]) -> Decision | None:
    """The decision that governs: highest precedence, then earliest text and offset."""
    if not decisions:
        return None
    return min(decisions, key=lambda d: (d.action.rank, d.index, d.start))
