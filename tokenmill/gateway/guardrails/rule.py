"""A parsed guardrail rule and the guardrails section: frozen, regexes compiled once."""

from __future__ import annotations

from dataclasses import dataclass

from tokenmill.gateway.guardrails.decision import Action, Stage
from tokenmill.gateway.guardrails.scanners import Scanner

DEFAULT_MASK = "[REDACTED:{entity}]"
DEFAULT_HOLD_BACK = 64
MAX_HOLD_BACK = 4096
# User text longer than this (per input text) is not scanned: the request is blocked.
DEFAULT_MAX_SCAN_CHARS = 1_000_000
MAX_SCAN_CHARS = 10_000_000


@dataclass(frozen=True)
class ClassifierSpec:
    """A yes/no question put to the served model: fires when P(positive) >= threshold."""

    prompt: str  # contains "{text}"
    positive: str  # stripped, lowercased
    threshold: float
    on_error: Action  # BLOCK, or AUDIT for "allow"
    timeout_s: float

    def render(self, text: str) -> str:
        return self.prompt.replace("{text}", text)


@dataclass(frozen=True)
class Rule:
    name: str
    kind: str  # the scanner name from the config
    stages: frozenset[Stage]
    action: Action
    scanner: Scanner | None = None  # None for `length` and `classifier`
    mask: str = DEFAULT_MASK
    fallback: str | None = None
    max_chars: int | None = None  # `length`
    classifier: ClassifierSpec | None = None

    def mask_for(self, label: str) -> str:
        return self.mask.format(entity=label, rule=self.name)


@dataclass(frozen=True)
class GuardrailsConfig:
    rules: tuple[Rule, ...] = ()
    hold_back_chars: int = DEFAULT_HOLD_BACK
    max_scan_chars: int = DEFAULT_MAX_SCAN_CHARS

    def rules_for(self, stage: Stage) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if stage in r.stages)

    def rule(self, name: str) -> Rule:
        return next(r for r in self.rules if r.name == name)
