"""`OutputChecker`: the output-stage rules over a streamed choice, holding back only the text
that could still become (part of) a match, so a match is caught before any of it is sent.

What is held: every detector (each pattern of each pattern rule) follows its chain, the
matches `finditer` finds in the whole text, over the text not emitted yet, with the `regex`
package's partial matching. A match is final when no more text can change it: it ends at
least `shape.ahead` characters (at least one) before the end of the text so far, so its
lookaheads, anchors and greedy repeats read only text that exists, and the pattern cannot
also match on through the end (`fullmatch(..., partial=True)`: a longer alternative, an open
lazy body). A partial match (`m.partial`) or a match that is not final is pending, and the
text from its start is held. Text before the earliest pending start is emitted, redact
masks on the final matches in it, exactly as `check_text` masks them (the cut moves back to
the start of a final match crossing it: a mask run is never split). A block or fallback
match stops the stream as soon as it is final; held text is dropped. A detector with
nothing pending is searched again only when a new character can start its pattern (first
characters read from the pattern, `pattern_shape`), so one delta costs a few searches.

On ordinary prose that holds the last word at most (" there" could be an email's local
part; "there," cannot): with the default rules, 3 to 5 characters on average (emails and
phone numbers included) against 56 before, so "Hello" goes out when " there" arrives. A match is held from its first character
until it is final: an email until the character after it.

How it stays exact and chunking-independent: the result is defined as an examination after
every character, and one at each delta's end gives the same, because a final match stays
final and the earliest pending start only moves forward. A stop seen at a delta's end is
bisected back to the first offset where its match was final, after what an examination
just before that would have emitted. Examinations also fall where the window would
overflow (hold_back_chars + 1 held) and exactly at each length rule's `max_chars + 1`. So
any chunking emits the same concatenation, equal to `check_output` on the whole text; and
while the window never filled (`forced == 0`), that is `check_text` on the whole text,
overlapping matches of different rules included, and a stop comes before any block or
fallback match of the whole text is emitted, even partly.

Limits: at most `hold_back_chars` characters are ever held. When a pending match reaches
that (a match or a partial one longer than the window less its lookahead: a PEM body, a long
JWT, a 64-character word that could still become an email's local part), the text is
decided as it stands, as before: at the cut (`hold_back_chars // 8` characters past the
window's start) the matches found so far
and those matching now that start before it are final (a block or fallback one stops the
stream; a redact one is masked as far as it goes and the chain starts again after it, so
the rest of a long token may pass), a partial one goes out as it is. Raise
`hold_back_chars` (up to 4096) for long secrets. A lookahead's reach is read from the
pattern (an unbounded one holds every match until the window is full); lookbehinds get
max(32, widest + 1) characters of emitted context. Length rules are decided at
`max_chars + 1` (their decision's `end`). Classifier rules run only at `finish_async` on
the whole output (cut to `max_scan_chars`), so a streamed response can only be stopped at
its end, withholding only what is still held then; a non-streamed one
(`check_output_async`) is judged before any of it is returned."""

from __future__ import annotations

from dataclasses import dataclass

from tokenmill.gateway.guardrails.classifier import Judge, run_classifiers
from tokenmill.gateway.guardrails.decision import Action, Decision, Span, Stage, strongest
from tokenmill.gateway.guardrails.matching import Hit, decision, length_decision, mask
from tokenmill.gateway.guardrails.rule import GuardrailsConfig, Rule
from tokenmill.gateway.guardrails.scanners import Detector

# A full window is cut this fraction of it past its start (not one character): a pending
# match as long as the window then costs one forced examination per hold_back // 8 chars.
FORCED_STEP_DIVISOR = 8
CONTEXT_CHARS = 32  # emitted text kept for lookbehinds and word boundaries (more if one needs)
_STOPS = (Action.BLOCK, Action.FALLBACK)
_OUT = Stage.OUTPUT

# A match one detector's chain has found: the absolute start and end of the whole match (what
# the chain steps over), the reported span (None when empty or vetted out by the detector's
# check), and the chain's index (rule, then detector order: ties in the order of `find_hits`).
Found = tuple[int, int, Span | None, int]
# Where the detectors with a match pending stand, and the final matches not emitted yet.
Moved = tuple[dict[int, int], dict[int, list[Found]]]


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
        chains = [(r, d) for r in rules if r.scanner is not None for d in r.scanner.detectors]
        self._rules: tuple[Rule, ...] = tuple(r for r, _ in chains)
        self._detectors: tuple[Detector, ...] = tuple(d for _, d in chains)
        self._lengths = tuple(r for r in rules if r.max_chars is not None)
        self._classifiers = tuple(r for r in rules if r.classifier is not None)
        self._hold = config.hold_back_chars
        self._context = max([CONTEXT_CHARS] + [d.shape.behind + 1 for d in self._detectors])
        # Which detectors a character can start a match of (the rest need not be searched).
        self._by_first: dict[str, list[int]] = {}
        for i, det in enumerate(self._detectors):
            for ch in det.shape.first or ():
                self._by_first.setdefault(ch, []).append(i)
        self._any_first = {i for i, d in enumerate(self._detectors) if d.shape.first is None}
        self._non_ascii_first = {
            i for i, d in enumerate(self._detectors) if d.shape.first_non_ascii
        }
        self._buf = ""  # context + held text
        self._base = 0  # absolute offset of _buf[0]
        self._done = 0  # absolute: emitted (or masked and emitted) up to here
        self._examined = 0  # absolute offset of the last examination
        self._seen = 0  # absolute: characters fed
        # Per detector (by index) with a match pending: where it starts (absolute; the text
        # before it is decided); a detector not here has nothing pending up to `_examined`.
        self._grow: dict[int, int] = {}
        # Per detector: the final matches it found from `_done` on, not emitted yet.
        self._settled: dict[int, list[Found]] = {}
        self._next_length = min((r.max_chars + 1 for r in self._lengths), default=1 << 62)  # type: ignore[operator]
        self._forced = 0  # examinations that had to cut into held text (the window was full)
        self._fired: set[str] = set()  # length rules already recorded
        self._whole: list[str] = []  # for classifiers, up to max_scan_chars
        self._whole_len = 0
        self._ended: Decision | None = None
        self._finished = False

    @property
    def needs_judge(self) -> bool:
        return bool(self._classifiers)

    @property
    def held(self) -> int:
        """Characters fed but not emitted yet."""
        return self._seen - self._done

    @property
    def emitted_chars(self) -> int:
        """Characters of the text emitted so far (as they are, or masked)."""
        return self._done

    @property
    def forced(self) -> int:
        """How many times the window was full and text was decided as it stood (then a
        match longer than the window may be cut; while 0, the output is exact)."""
        return self._forced

    def feed(self, delta: str) -> StreamStep:
        if self._ended or self._finished:
            return StreamStep("")
        if self._classifiers:
            self._keep_whole(delta)
        steps: list[StreamStep] = []
        at = 0
        while at < len(delta):  # up to each point where the window could overflow
            room = min(self._done + self._hold + 1, self._next_length) - self._seen
            piece = delta[at : at + room]
            at += len(piece)
            self._buf += piece
            self._seen += len(piece)
            steps.append(self._examine())
            if steps[-1].stop:
                break
        return _join(steps)

    def finish(self) -> StreamStep:
        if self._classifiers:
            raise RuntimeError("output classifier rules need finish_async(judge)")
        if self._ended or self._finished:
            return StreamStep("")
        self._finished = True
        return self._decide(self._seen, self._advance(self._seen, final=True), final=True)

    async def finish_async(self, judge: Judge | None) -> StreamStep:
        """`finish`, then the classifier rules on the whole output before the held text goes."""
        if self._ended or self._finished:
            return StreamStep("")
        self._finished = True
        step = self._decide(self._seen, self._advance(self._seen, final=True), final=True)
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

    def _examine(self) -> StreamStep:
        """Decides at the text fed so far, exactly as examining after every character would:
        a stop is put at the first offset where its match was final, after what an
        examination just before it would have emitted."""
        end = self._seen
        moved = self._advance(end, final=False)
        at = end
        if self._has_stop(moved[1]):
            lo = self._examined  # no stop there, one at `at`: bisect (a final match stays final)
            while at - lo > 1:
                mid = (lo + at) // 2
                lo, at = (lo, mid) if self._has_stop(self._advance(mid, False)[1]) else (mid, at)
        elif end < self._next_length:  # no length rule reached: a stop now is only forced
            return self._decide(end, moved, False)
        steps = []
        if at - 1 > self._examined:
            steps.append(self._decide(at - 1, self._advance(at - 1, False), False))
        fresh = not steps and at == end  # `moved` is still from the current state
        steps.append(self._decide(at, moved if fresh else self._advance(at, False), False))
        if at < end and not steps[-1].stop:  # cannot happen
            steps.append(self._decide(end, self._advance(end, False), False))
        return _join(steps)

    def _advance(self, end: int, final: bool) -> Moved:
        """Every detector's chain followed to `end` (the checker's state is left as it is)."""
        base = self._base
        view = self._buf if end == self._seen else self._buf[: end - base]
        grows, settled = dict(self._grow), dict(self._settled)
        if final:
            todo: set[int] | range = range(len(self._detectors))
        else:  # the pending ones, and those a new character can start
            fresh = self._buf[self._examined - base : end - base]
            todo = self._any_first | grows.keys()
            if not fresh.isascii():
                todo |= self._non_ascii_first
            for ch in set(fresh):
                todo.update(self._by_first.get(ch, ()))
        for i in todo:
            found, at = _follow(
                self._detectors[i], view, grows.get(i, self._examined) - base, base, i, final
            )
            if at < end:
                grows[i] = at
            else:
                grows.pop(i, None)
            if found:
                settled[i] = settled.get(i, []) + found
        return grows, settled

    def _has_stop(self, settled: dict[int, list[Found]]) -> bool:
        return any(
            span is not None and self._rules[i].action in _STOPS
            for chain in settled.values()
            for _, _, span, i in chain
        )

    def _decide(self, end: int, moved: Moved, final: bool) -> StreamStep:
        grows, settled = moved
        self._examined = end
        lengths = self._length_decisions(end)
        if not settled and not lengths and not final:  # the usual step: no match, plain text
            boundary = min(grows.values(), default=end)
            if end - boundary <= self._hold:
                self._grow = grows
                return self._emit(boundary, [], [])
        found = [f for chain in settled.values() for f in chain]
        hits = self._hits(found)
        stops = [decision(r, _OUT, s) for r, s in hits if r.action in _STOPS]
        stops += [d for d in lengths if d.action in _STOPS]
        if stops:
            return self._stop(hits, lengths, stops)
        boundary = end if final else _boundary(found, min(grows.values(), default=end))
        if end - boundary > self._hold:
            return self._force(end, found, grows, lengths)
        emitted = hits if final else self._hits([f for f in found if f[0] < boundary])
        self._grow = grows
        self._settled = {}
        for i, chain in settled.items():
            if kept := [f for f in chain if f[0] >= boundary]:
                self._settled[i] = kept
        return self._emit(boundary, emitted, lengths)

    def _force(
        self, end: int, found: list[Found], grows: dict[int, int], lengths: list[Decision]
    ) -> StreamStep:
        """The window is full: what was found and what matches as it stands now and starts
        before the cut is final; a match crossing the cut is emitted whole, as before the
        window was narrowed to what can still match."""
        self._forced += 1
        cut = end - self._hold + max(1, self._hold // FORCED_STEP_DIVISOR)
        base = self._base
        view = self._buf[: end - base]
        found = list(found)
        for i, at in grows.items():
            det = self._detectors[i]
            if at < cut:
                for m in det.pattern.finditer(view, at - base):
                    if m.start() + base >= cut:
                        break
                    found.append((m.start() + base, m.end() + base, det.span(m, base), i))
        hits = self._hits(found)
        stops = [decision(r, _OUT, s) for r, s in hits if r.action in _STOPS]
        if stops:
            return self._stop(hits, lengths, stops)
        emitted, boundary = _settle(hits, self._done, cut)
        # A chain cut into, or with final matches not emitted, starts again at the boundary;
        # the others stand where they were.
        again = {i for i, at in grows.items() if at < boundary}
        again |= {i for start, _, _, i in found if start >= boundary}
        self._grow = {i: at for i, at in grows.items() if i not in again}
        if boundary < end:
            self._grow |= dict.fromkeys(again, boundary)
        self._settled = {}
        return self._emit(boundary, emitted, lengths)

    def _emit(self, boundary: int, hits: list[Hit], lengths: list[Decision]) -> StreamStep:
        if boundary == self._done and not lengths:
            return StreamStep("")
        text = self._buf[self._done - self._base : boundary - self._base]
        emit = mask(text, hits, self._done) if hits else text
        self._done = boundary
        keep = max(0, boundary - self._context)
        self._buf = self._buf[keep - self._base :]
        self._base = keep
        return StreamStep(emit, tuple([decision(r, _OUT, s) for r, s in hits] + lengths))

    def _stop(self, hits: list[Hit], lengths: list[Decision], stops: list[Decision]) -> StreamStep:
        stop = strongest(stops)
        assert stop is not None
        self._ended = stop
        found = [decision(r, _OUT, s) for r, s in hits] + lengths
        return StreamStep("", tuple(found), stop, self._replacement(stop))

    def _hits(self, found: list[Found]) -> list[Hit]:
        """The reported spans, by start, then longest, then rule and detector order."""
        keyed = [(s.start, -s.end, i, s) for _, _, s, i in found if s is not None]
        keyed.sort(key=lambda k: k[:3])
        return [(self._rules[i], s) for _, _, i, s in keyed]

    def _length_decisions(self, end: int) -> list[Decision]:
        found = []
        if end < self._next_length:
            return found
        for rule in self._lengths:
            if rule.name not in self._fired and (d := length_decision(rule, _OUT, end)):
                self._fired.add(rule.name)
                found.append(d)
        unfired = (r.max_chars + 1 for r in self._lengths if r.name not in self._fired)
        self._next_length = min(unfired, default=1 << 62)  # type: ignore[operator]
        return found


def _follow(
    det: Detector, view: str, pos: int, base: int, index: int, final: bool
) -> tuple[list[Found], int]:
    """One detector's matches in `view` from `pos` that are final, and where its chain stands
    (absolute): the start of the first match that may still grow or change with more text
    (a partial match, or a match that ends within `shape.ahead` characters of the end, or one
    whose pattern could also match through to the end), else the end of `view`. `final`:
    the text is complete, every match is final."""
    pattern = det.pattern
    found: list[Found] = []
    if final:
        for m in pattern.finditer(view, pos):
            found.append((m.start() + base, m.end() + base, det.span(m, base), index))
        return found, len(view) + base
    ahead = max(det.shape.ahead, 1)
    size = len(view)
    first = pattern.search(view, pos, partial=True)  # the usual answer: none, or pending
    if first is None:
        return found, size + base
    if first.partial or first.end() + ahead > size:
        return found, first.start() + base
    for m in pattern.finditer(view, pos, partial=True):
        start, end = m.span()
        if m.partial or end + ahead > size or pattern.fullmatch(view, start, partial=True):
            return found, start + base
        found.append((start + base, end + base, det.span(m, base), index))
    return found, size + base


def _boundary(found: list[Found], at: int) -> int:
    """`at`, moved back to the start of any final match that crosses it (held whole)."""
    while crossing := [s for s, e, _, _ in found if s < at < e]:
        at = min(crossing)
    return at


def _settle(hits: list[Hit], done: int, cut: int) -> tuple[list[Hit], int]:
    """The hits that are final at a forced cut and the new emit boundary: overlapping hits
    form clusters; a cluster starting before `cut` is final (one crossing it moves the
    boundary to its end); later ones stay held."""
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


def _join(steps: list[StreamStep]) -> StreamStep:
    if len(steps) <= 1:
        return steps[0] if steps else StreamStep("")
    last = steps[-1]
    decisions = tuple(d for s in steps for d in s.decisions)
    return StreamStep("".join(s.emit for s in steps), decisions, last.stop, last.replacement)


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
