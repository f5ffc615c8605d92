"""`check_input`: a request's user-controlled texts against the input-stage rules."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tokenmill.gateway.guardrails.classifier import Judge, run_classifiers
from tokenmill.gateway.guardrails.decision import Action, Decision, Stage, strongest
from tokenmill.gateway.guardrails.rule import GuardrailsConfig
from tokenmill.gateway.guardrails.text_check import check_text


@dataclass(frozen=True)
class InputVerdict:
    """`blocked` or else `fallback` governs (block > fallback); `replacement` is the fallback
    answer to send instead of calling the model. `texts` are the (redacted) texts in order,
    the very same objects where nothing was redacted. `decisions` lists every firing."""

    decisions: tuple[Decision, ...]
    texts: list[str]
    blocked: Decision | None = None
    fallback: Decision | None = None
    replacement: str | None = None


OFFLOAD_CHARS = 16_384


async def check_input(
    config: GuardrailsConfig, texts: list[str], judge: Judge | None = None
) -> InputVerdict:
    """Deterministic rules on each text; then classifier rules, each asked once about all the
    (redacted) texts joined by blank lines, cut to `max_scan_chars`. Classifiers are skipped
    when a deterministic rule already blocks (no model call for a refused request)."""

    def scan() -> list:
        return [check_text(config, Stage.INPUT, t, i) for i, t in enumerate(texts)]

    # a long request is scanned on a worker thread: the event loop keeps serving the others
    large = sum(len(t) for t in texts) > OFFLOAD_CHARS
    verdicts = await asyncio.to_thread(scan) if large else scan()
    redacted = [v.text for v in verdicts]
    decisions = [d for v in verdicts for d in v.decisions]
    stop = strongest([v.stop for v in verdicts if v.stop])
    if texts and not (stop and stop.action is Action.BLOCK):
        joined = "\n\n".join(redacted)[: config.max_scan_chars]
        found = await run_classifiers(config.rules_for(Stage.INPUT), Stage.INPUT, joined, judge)
        decisions += found
        stop = strongest(
            [d for d in [stop, *found] if d and d.action in (Action.BLOCK, Action.FALLBACK)]
        )
    if stop is None:
        return InputVerdict(tuple(decisions), redacted)
    if stop.action is Action.BLOCK:
        return InputVerdict(tuple(decisions), redacted, blocked=stop)
    return InputVerdict(
        tuple(decisions), redacted, fallback=stop, replacement=config.rule(stop.rule).fallback
    )
