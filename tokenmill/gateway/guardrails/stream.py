"""`OutputChecker`: the output-stage rules over a streamed choice, holding back a bounded
window so a match is caught before any of it is sent.

How it stays exact and chunking-independent: the text is examined only at fixed absolute
offsets, every `step = hold_back_chars // 8` characters (and at `finish`), never at the
delta boundaries, so what is emitted is a function of the text alone: any chunking of the
same text emits the same concatenation, equal to `check_output` on the whole text.

At an examination at offset T, the window is the not-yet-emitted text (plus 32 characters
of emitted context for lookbehinds and word boundaries). A block or fallback match anywhere
in it stops the stream at once; held text is dropped (what was emitted before stays sent).
Otherwise text before T - (hold_back - step) is emitted, redact matches masked; a match
crossing that cut is settled as it stands and emitted whole.

Limits: at most `hold_back_chars` characters are ever held. A match up to
`hold_back - step - 1` characters (55 with the default 64; lookaheads of up to 2 chars) is
caught whole, exactly as `check_text` finds it, unless it overlaps a match of another
detector settled at an earlier examination (then it can be missed: e.g. an email whose
local part starts inside a card number). A longer one (a PEM body, a long JWT) is caught by
its first `hold_back - step` characters when the pattern already matches there, as the
token patterns do (`sk-` + 20 chars...), which is enough to block or fall back; a
redaction masks only that part and the rest may pass. Raise `hold_back_chars` (up to 4096)
for long secrets. Length rules stop at the first examination past `max_chars`. Classifier rules run
only at `finish_async` on the whole output (cut to `max_scan_chars`), so a streamed
response can only be stopped at its end; a non-streamed one (`check_output_async`) is judged
before any of it is returned."""

from __future__ import annotations

from dataclasses import dataclass

from tokenmill.gateway.guardrails.classifier import Judge, run_classifiers
from tokenmill.gateway.guardrails.decision import Action, Decision, Stage, strongest
from tokenmill.gateway.guardrails.matching import Hit, decision, find_hits, length_decision, mask
from tokenmill.gateway.guardrails.rule import GuardrailsConfig

STEP_DIVISOR = 8
CONTEXT_CHARS = 32
_STOPS = (Action.BLOCK, Action.FALLBACK)
_OUT = Stage.OUTPUT


@dataclass(frozen=True)
class StreamStep:
    """`emit` is safe to send now. `stop`: end the choice (block: an error event with
    `stop.code`/`stop.message`; fallback: send `replacement`)."""

    emit: str
    decisions: tuple[Decision, ...] = ()
    stop: Decision | None = None
    replacement: str | None = None


class OutputChecker:
    """One per choice: `feed` each text delta, then `finish` (or `finish_async` with a judge
    when the config has output classifier rules). After a stop, further calls return
    empty steps."""

    def __init__(self, config: GuardrailsConfig) -> None:
        rules = config.rules_for(_OUT)
        self._config = config
        self._patterns = tuple(r for r in rules if r.scanner is not None)
        self._lengths = tuple(r for r in rules if r.max_chars is not None)
        self._classifiers = tuple(r for r in rules if r.classifier is not None)
        self._step = max(1, config.hold_back_chars // STEP_DIVISOR)
        self._hold = config.hold_back_chars - self._step  # text kept back after an examination
        self._buf = ""  # context + held + unexamined text
        self._base = 0  # absolute offset of _buf[0]
        self._done = 0  # absolute: emitted (or masked and emitted) up to here
        self._examined = 0  # absolute offset of the last examination
        self._seen = 0  # absolute: characters fed
        self._fired: set[str] = set()  # length rules already recorded
        self._whole: list[str] = []  # for classifiers, up to max_scan_chars
        self._whole_len = 0
        self._ended: Decision | None = None
        self._finished = False

    @property
    def needs_judge(self) -> bool:
        return bool(self._classifiers)

    def feed(self, delta: str) -> StreamStep:
        if self._ended or self._finished:
            return StreamStep("")
        if self._classifiers:
            self._keep_whole(delta)
        emits: list[str] = []
        decisions: list[Decision] = []
        at = 0
        while at < len(delta):  # in slices up to each examination offset: the buffer stays small
            piece = delta[at : at + self._examined + self._step - self._seen]
            at += len(piece)
            self._buf += piece
            self._seen += len(piece)
            if self._seen == self._examined + self._step:
                step = self._examine(self._seen, final=False)
                emits.append(step.emit)
                decisions += step.decisions
                if step.stop:
                    return StreamStep("".join(emits), tuple(decisions), step.stop, step.replacement)
        return StreamStep("".join(emits), tuple(decisions))

    def finish(self) -> StreamStep:
        if self._classifiers:
            raise RuntimeError("output classifier rules need finish_async(judge)")
        if self._ended or self._finished:
            return StreamStep("")
        self._finished = True
        return self._examine(self._seen, final=True)

    async def finish_async(self, judge: Judge | None) -> StreamStep:
        """`finish`, then the classifier rules on the whole output before the held text goes."""
        if self._ended or self._finished:
            return StreamStep("")
        self._finished = True
        step = self._examine(self._seen, final=True)
        if step.stop or not self._classifiers:
            return step
        text = "".join(self._whole)
        found = await run_classifiers(self._classifiers, _OUT, text, judge)
        stop = strongest([d for d in found if d.action in _STOPS])
        if stop is None:
            return StreamStep(step.emit, step.decisions + tuple(found))
        self._ended = stop
        return StreamStep("", step.decisions + tuple(found), stop, self._replacement(stop))

    def _keep_whole(self, delta: str) -> None:
        room = self._config.max_scan_chars - self._whole_len
        if room > 0:
            self._whole.append(delta[:room])
            self._whole_len += len(self._whole[-1])

    def _replacement(self, stop: Decision) -> str | None:
        return self._config.rule(stop.rule).fallback if stop.action is Action.FALLBACK else None

    def _examine(self, end: int, final: bool) -> StreamStep:
        self._examined = end
        start = max(self._base, self._done - CONTEXT_CHARS)
        view = self._buf[start - self._base : end - self._base]
        hits = find_hits(self._patterns, view, self._done - start)
        lengths = self._length_decisions(end)
        stops = [decision(r, _OUT, s, start) for r, s in hits if r.action in _STOPS]
        stops += [d for d in lengths if d.action in _STOPS]
        if stops:
            stop = strongest(stops)
            assert stop is not None
            self._ended = stop
            found = [decision(r, _OUT, s, start) for r, s in hits] + lengths
            return StreamStep("", tuple(found), stop, self._replacement(stop))
        cut = end if final else end - self._hold
        settled, boundary = _settle(hits, self._done - start, cut - start)
        boundary += start
        emit = mask(view[self._done - start : boundary - start], settled, self._done - start)
        found = [decision(r, _OUT, s, start) for r, s in settled] + lengths
        self._done = boundary
        keep = max(0, boundary - CONTEXT_CHARS)
        self._buf = self._buf[keep - self._base :]
        self._base = keep
        return StreamStep(emit, tuple(found))

    def _length_decisions(self, end: int) -> list[Decision]:
        found = []
        for rule in self._lengths:
            if rule.name not in self._fired and (d := length_decision(rule, _OUT, end)):
                self._fired.add(rule.name)
                found.append(d)
        return found


def _settle(hits: list[Hit], done: int, cut: int) -> tuple[list[Hit], int]:
    """The hits that are final at this examination and the new emit boundary (view offsets):
    overlapping hits form clusters; a cluster starting before `cut` is final (one crossing it
    moves the boundary to its end); later ones stay held."""
    settled: list[Hit] = []
    boundary = max(done, cut)
    cluster_end = -1
    for rule, span in hits:  # sorted by start
        if span.start >= cut and span.start >= cluster_end:
            break
        settled.append((rule, span))
        cluster_end = max(cluster_end, span.end)
        boundary = max(boundary, cluster_end)
    return settled, boundary


@dataclass(frozen=True)
class OutputVerdict:
    """A whole (non-streamed) output: `text` is what the stream would have emitted; when
    `stop` is set the response is blocked or replaced by `replacement` instead."""

    text: str
    decisions: tuple[Decision, ...]
    stop: Decision | None = None
    replacement: str | None = None


def check_output(config: GuardrailsConfig, text: str) -> OutputVerdict:
    """The deterministic output rules over a whole text, exactly as a stream would see it."""
    checker = OutputChecker(config)
    return _verdict(checker.feed(text), checker.finish())


async def check_output_async(
    config: GuardrailsConfig, text: str, judge: Judge | None
) -> OutputVerdict:
    """`check_output` plus the output classifier rules."""
    checker = OutputChecker(config)
    first = checker.feed(text)
    return _verdict(first, first if first.stop else await checker.finish_async(judge))


def _verdict(first: StreamStep, last: StreamStep) -> OutputVerdict:
    if first.stop:
        return OutputVerdict(first.emit, first.decisions, first.stop, first.replacement)
    return OutputVerdict(
        first.emit + last.emit, first.decisions + last.decisions, last.stop, last.replacement
    )
