"""Classifier rules: ask a judge (the served model, via the middleware) a yes/no question.

`judge(prompt)` returns candidate next tokens (stripped, lowercased) mapped to probabilities;
keys are normalised again here and equal keys summed. The rule fires when P(positive) >=
threshold. A judge error, a timeout or a malformed answer yields a `classifier_error`
decision whose action is the rule's `on_error` (allow is recorded as audit)."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Mapping

from tokenmill.gateway.guardrails.decision import Decision, Stage
from tokenmill.gateway.guardrails.rule import Rule

Judge = Callable[[str], Awaitable[Mapping[str, float]]]
logger = logging.getLogger("tokenmill.gateway")


def positive_probability(answer: Mapping[str, float], positive: str) -> float:
    if not isinstance(answer, Mapping):
        raise TypeError(f"judge returned {type(answer).__name__}, not a mapping")
    total = 0.0
    for token, p in answer.items():
        if (
            isinstance(p, bool)
            or not isinstance(p, int | float)
            or not 0.0 <= p <= 1.0
            or math.isnan(p)
        ):
            raise ValueError(f"judge returned a bad probability {p!r}")
        if isinstance(token, str) and token.strip().lower() == positive:
            total += p
    return min(total, 1.0)


async def classify(rule: Rule, stage: Stage, text: str, judge: Judge) -> Decision | None:
    spec = rule.classifier
    assert spec is not None
    try:
        answer = await asyncio.wait_for(judge(spec.render(text)), spec.timeout_s)
        p = positive_probability(answer, spec.positive)
    except asyncio.CancelledError:
        raise
    except Exception as e:  # any judge failure: decided by on_error, never a crash
        logger.warning("gateway: classifier rule %s: the judge failed (%r)", rule.name, e)
        return Decision(rule.name, stage, spec.on_error, "classifier_error", "", 0, len(text))
    if p < spec.threshold:
        return None
    return Decision(rule.name, stage, rule.action, "classifier", "", 0, len(text))


async def run_classifiers(
    rules: tuple[Rule, ...], stage: Stage, text: str, judge: Judge | None
) -> list[Decision]:
    """The rules' judges run concurrently; decisions in rule order."""
    rules = tuple(r for r in rules if r.classifier is not None)
    if not rules:
        return []
    if judge is None:
        raise ValueError(f"guardrail classifier rule {rules[0].name!r} needs a judge")
    results = await asyncio.gather(*(classify(r, stage, text, judge) for r in rules))
    return [d for d in results if d is not None]
