"""How many drafts pay this step: measured decode-step times by row count, each proposer's
measured drafting time, and each request's recent acceptance.

A verification row is not free (on a CPU it costs a fair part of a whole decode step), nor is
a draft head's draft, so drafting k tokens pays only when the tokens it is expected to add
outweigh the time it adds. With per-draft acceptance rate a, k drafts yield
E(k) = (1 - a^(k+1)) / (1 - a) tokens (the accepted run plus the target's own token). The
step's expected tokens per second, (tokens of the other rows + E(k)) / (T(rows + k) + D +
k * c), picks k; k = 0 switches speculation off for the request this step (chat-like traffic,
large batches). c is the proposer's drafting time per token where the drafts are still to be
made (a draft head: each draft runs the head), D the drafting already done this step.

A draft head scores its drafts (its probability of each pick), and one number a hides what
those scores tell apart: on held-out chat a quarter of a head's drafts score above 0.9 and
are right 92% of the time, while its 0.5-0.6 drafts are right 45%. Its chain is therefore
sized after drafting, from P_i = c_1 ... c_i with c the acceptance measured at each score
(Calibration): k drafts yield 1 + P_1 + ... + P_k tokens.

T is the engine's own decode-only step time by row count and context size, drafting time
excluded (the median of the latest steps); a row count not measured lately is extrapolated
from the nearest measured one of the same context size with a prior cost per extra row, so
the first drafts explore it and its measurement then decides. Measurements expire after a
few hundred decode steps: a row count the policy stopped choosing (its first steps were slow,
say) is tried again instead of keeping a stale verdict for good.
"""

from __future__ import annotations

import statistics
from collections import deque

from tokenmill.config import MAX_SPEC_ROWS

_WINDOW = 16  # latest step times kept per row count
_TRUSTED = 3  # observations before a row count's own median is used
FRESH_STEPS = 256  # decode steps an observation counts for (then the row count is re-tried)
_PRIOR_ROW_COST = 0.35  # extra row vs a 1-row step, until measured (CPU decode, 2 cores)
_DECAY = 0.8  # weight of a request's earlier drafts in its acceptance estimate
_IDLE_DECAY = 0.9  # per step without drafts: the estimate drifts back toward the prior
_SERVER_DECAY = 0.98  # the server-wide estimate: the last ~50 verifications of any request
_SERVER_IDLE_DECAY = 0.995  # per request-step without drafts (it drifts back to _FIRST_PRIOR)
_PRIOR_TRIALS = 2.0  # a request's prior: the server-wide rate, weakly held
_FIRST_PRIOR = 0.7  # the server-wide rate before any verification
_DRAFT_COST_DECAY = 0.9  # weight of earlier drafts in a proposer's seconds per draft
CONFIDENCE_BINS = 10  # a draft head's probability of its pick, in bins of 0.1
_CALIBRATION_DECAY = 0.999  # weight of earlier verified drafts in a bin (the last ~1000)
_CALIBRATION_PRIOR = 4.0  # pseudo-drafts at a bin's prior: its midpoint less 0.1
# a head's chain stops before its drafts' probability product falls below this: no draft
# that unlikely pays for its verification row (a row costs 0.25-0.4 of a step here)
MIN_CHAIN_PROB = 0.1
# Where a step's drafts came from: the configured proposer, or the n-gram lookup that a draft
# head proposer tries first. Each keeps its own acceptance estimates.
DRAFT_SOURCES = ("proposer", "lookup")


def context_bucket(context_tokens: int) -> int:
    """Steps are compared within a context size (attention grows with it): 0-1023 tokens of
    the decoding requests together, 1024-2047, 2048-4095, ... (at most 8 buckets)."""
    return min(max(context_tokens, 1).bit_length() - 10, 7) if context_tokens >= 1024 else 0


class StepTimes:
    """Decode-only step time by context bucket and number of query rows (1..MAX_SPEC_ROWS):
    the median of the latest observations of the last FRESH_STEPS decode steps, trusted from
    the third one on (a first step of a new shape can be slow for reasons of its own); until
    then extrapolated from the nearest measured row count of the same bucket, so the row count
    gets tried."""

    def __init__(self) -> None:
        self.samples: dict[tuple[int, int], deque[tuple[int, float]]] = {}
        self.clock = 0  # decode steps observed
        # each bucket's estimates for 1..MAX_SPEC_ROWS rows, until the next observation (the
        # policy asks ~20 times a step)
        self._estimates: dict[int, list[float]] = {}

    def observe(self, rows: int, seconds: float, context_tokens: int = 0) -> None:
        if 1 <= rows <= MAX_SPEC_ROWS:
            self.clock += 1
            key = (context_bucket(context_tokens), rows)
            self.samples.setdefault(key, deque(maxlen=_WINDOW)).append((self.clock, seconds))
            self._estimates.clear()

    def measured(self, rows: int, context_tokens: int = 0) -> float | None:
        s = self.samples.get((context_bucket(context_tokens), rows))
        if not s or len(s) < _TRUSTED:
            return None
        since = self.clock - FRESH_STEPS
        fresh = [seconds for clock, seconds in s if clock > since]
        return statistics.median(fresh) if len(fresh) >= _TRUSTED else None

    def estimate(self, rows: int, context_tokens: int = 0) -> float:
        """Seconds for a step of `rows` rows (relative units before anything is measured)."""
        bucket = context_bucket(context_tokens)
        if bucket not in self._estimates:
            self._estimates[bucket] = self._estimate_all(context_tokens)
        return self._estimates[bucket][min(rows, MAX_SPEC_ROWS) - 1]

    def _estimate_all(self, context_tokens: int) -> list[float]:
        rows = range(1, MAX_SPEC_ROWS + 1)
        measured = {m: t for m in rows if (t := self.measured(m, context_tokens)) is not None}
        if not measured:
            return [1.0 + _PRIOR_ROW_COST * (r - 1) for r in rows]
        out = []
        for r in rows:
            if r in measured:
                out.append(measured[r])
                continue
            near = min(measured, key=lambda m: abs(m - r))
            one_row = measured[near] / (1.0 + _PRIOR_ROW_COST * (near - 1))
            out.append(one_row * (1.0 + _PRIOR_ROW_COST * (r - 1)))
        return out


class DraftCost:
    """A proposer's recent drafting seconds per drafted token (decayed mean; 0 until seen).
    A verdict expires as step times do: FRESH_STEPS request-steps without drafting forget it,
    so one slow first chain (a cold start beside other busy processes) cannot price the
    proposer out for good (it would never draft, so never be measured again)."""

    __slots__ = ("seconds", "drafts", "idle_steps")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.drafts = 0.0
        self.idle_steps = 0

    def observe(self, drafts: int, seconds: float) -> None:
        if drafts > 0:
            self.seconds = _DRAFT_COST_DECAY * self.seconds + seconds
            self.drafts = _DRAFT_COST_DECAY * self.drafts + drafts
            self.idle_steps = 0

    def idle(self) -> None:
        """A request-step the proposer was not asked (its drafts would not pay)."""
        self.idle_steps += 1
        if self.idle_steps >= FRESH_STEPS:
            self.seconds = self.drafts = 0.0
            self.idle_steps = 0

    def per_draft(self) -> float:
        return self.seconds / self.drafts if self.drafts else 0.0


def expected_tokens(acceptance: float, drafts: int) -> float:
    """Tokens a step yields for a request with `drafts` drafts (accepted run + 1)."""
    if acceptance >= 1.0:
        return drafts + 1.0
    return (1.0 - acceptance ** (drafts + 1)) / (1.0 - acceptance)


class DraftPolicy:
    """Per step: starts from the decoding rows, then sizes each request's drafts in turn."""

    def __init__(self, times: StepTimes, adaptive: bool = True) -> None:
        self.times = times
        self.adaptive = adaptive
        # all requests' drafts, per source (the proposer; the n-gram lookup a draft head tries
        # first): a new request's prior
        self.servers = {s: Acceptance(_SERVER_DECAY) for s in DRAFT_SOURCES}
        # seconds per draft of each source, measured by the scheduler (n-gram lookup: ~0)
        self.draft_costs = {s: DraftCost() for s in DRAFT_SOURCES}
        # a scoring proposer's (a draft head's) acceptance by its own probability
        self.calibration = Calibration()
        self.rows = 0
        self.tokens = 0.0
        self.context = 0
        self.drafting = 0.0  # drafting seconds spent this step

    def start_step(self, decoding: int, context_tokens: int = 0) -> None:
        self.rows = decoding
        self.tokens = float(decoding)
        self.context = context_tokens
        self.drafting = 0.0

    def num_drafts(self, acceptance: float, limit: int, draft_seconds: float = 0.0) -> int:
        """How many of up to `limit` drafts to verify for a decoding request, each still to be
        made at `draft_seconds` (0: the drafts are at hand)."""
        if not self.adaptive or limit <= 0:
            return max(limit, 0)
        others = self.tokens - 1.0
        t = self.times.estimate
        best, best_rate = 0, self.tokens / (t(self.rows, self.context) + self.drafting)
        for k in range(1, limit + 1):
            seconds = t(self.rows + k, self.context) + self.drafting + k * draft_seconds
            rate = (others + expected_tokens(acceptance, k)) / seconds
            if rate > best_rate:
                best, best_rate = k, rate
        return best

    def commit(self, acceptance: float, drafts: int) -> None:
        self.rows += drafts
        self.tokens += expected_tokens(acceptance, drafts) - 1.0

    def num_scored_drafts(self, probs: list[float]) -> int:
        """How many of a chain's drafts to verify, from each draft's probability under the
        head (calibrated: the acceptance measured at that probability): draft i is accepted
        with probability P_i = c_1 ... c_i, so k drafts yield 1 + P_1 + ... + P_k tokens.
        Their drafting is done (priced in the step's time already)."""
        if not self.adaptive:
            return len(probs)
        chain = self.calibration.chain(probs)
        others = self.tokens - 1.0
        t = self.times.estimate
        best, best_rate = 0, self.tokens / (t(self.rows, self.context) + self.drafting)
        gained = 1.0
        for k, p in enumerate(chain, 1):
            gained += p
            rate = (others + gained) / (t(self.rows + k, self.context) + self.drafting)
            if rate > best_rate:
                best, best_rate = k, rate
        return best

    def min_chain_prob(self) -> float:
        """The least probability (the head's own, which runs high) a draft needs to be worth
        drafting: below it, one more verification row would not pay this step (`fixed`: 0)."""
        if not self.adaptive:
            return 0.0
        t = self.times.estimate
        now = t(self.rows, self.context) + self.drafting
        extra = t(self.rows + 1, self.context) - t(self.rows, self.context)
        return max(MIN_CHAIN_PROB, min(0.9, self.tokens * extra / max(now, 1e-9)))

    def commit_scored(self, probs: list[float], drafts: int) -> None:
        self.rows += drafts
        self.tokens += sum(self.calibration.chain(probs[:drafts]))

    def drafted(self, source: str, drafts: int, seconds: float) -> None:
        """A proposer drafted this step: its cost per draft, and time the step now takes."""
        self.draft_costs[source].observe(drafts, seconds)
        self.drafting += seconds

    def acceptance(self, request: Acceptance, source: str = "proposer") -> float:
        """A request's acceptance estimate; its prior is the server-wide rate."""
        return request.rate(self.servers[source].rate())

    def record(
        self, request: Acceptance, drafted: int, accepted: int, source: str = "proposer"
    ) -> None:
        request.record(drafted, accepted)
        self.servers[source].record(drafted, accepted)

    def idle(self, request: Acceptance, source: str = "proposer") -> None:
        """A request given no drafts this step: its evidence and (slowly) the server's fade."""
        request.idle()
        self.servers[source].idle(_SERVER_IDLE_DECAY)


class Acceptance:
    """A recent per-draft acceptance rate (decayed counts with a prior): each request's, and
    the server's over all requests, which is a new request's prior (so a proposer that does
    not pay for this traffic, e.g. a draft head on chat it was not trained for, is not tried
    afresh at every request)."""

    __slots__ = ("trials", "accepted", "decay")

    def __init__(self, decay: float = _DECAY) -> None:
        self.trials = 0.0
        self.accepted = 0.0
        self.decay = decay

    def rate(self, prior: float = _FIRST_PRIOR) -> float:
        return (self.accepted + _PRIOR_TRIALS * prior) / (self.trials + _PRIOR_TRIALS)

    def idle(self, decay: float = _IDLE_DECAY) -> None:
        """A step without drafts (none would pay): older evidence fades toward the prior, so a
        request whose drafts failed tries again after a while (a copy task's edit point
        passes; without this it would never draft again and never see it)."""
        self.trials *= decay
        self.accepted *= decay

    def record(self, drafted: int, accepted: int) -> None:
        """`accepted` of `drafted` passed: accepted successes, then one failure unless all
        passed (the drafts after a rejection were never tested)."""
        self.trials = self.decay * self.trials + accepted + (1 if accepted < drafted else 0)
        self.accepted = self.decay * self.accepted + accepted


class Calibration:
    """The measured acceptance of a scoring proposer's drafts by the probability it gave
    them: decayed counts of verified and accepted drafts per bin of 0.1 (a draft counts where
    it was tested: every draft before it was accepted), each bin starting from a prior a
    little under its midpoint (a head trained with cross-entropy is overconfident: on held-out
    chat a 0.5-0.6 pick was right 45% of the time, a 0.9-1.0 one 92%)."""

    def __init__(self) -> None:
        self.trials = [0.0] * CONFIDENCE_BINS
        self.accepted = [0.0] * CONFIDENCE_BINS

    @staticmethod
    def bin(prob: float) -> int:
        return min(max(int(prob * CONFIDENCE_BINS), 0), CONFIDENCE_BINS - 1)

    def rate(self, prob: float) -> float:
        b = self.bin(prob)
        prior = max((b + 0.5) / CONFIDENCE_BINS - 0.1, 0.0)
        return (self.accepted[b] + _CALIBRATION_PRIOR * prior) / (
            self.trials[b] + _CALIBRATION_PRIOR
        )

    def chain(self, probs: list[float]) -> list[float]:
        """P_i: the probability that drafts 1..i are all accepted."""
        out, p = [], 1.0
        for prob in probs:
            p *= self.rate(prob)
            out.append(p)
        return out

    def best_rate(self) -> float:
        """The acceptance of the most confident drafts: the most a draft can be worth."""
        return max(self.rate((b + 0.5) / CONFIDENCE_BINS) for b in range(CONFIDENCE_BINS))

    def idle(self, decay: float = _SERVER_IDLE_DECAY) -> None:
        """A request-step without the head's drafts (none would pay): the evidence fades
        toward the priors, so a head that stopped paying (on copying, say) is tried again
        once the traffic may have changed, instead of never drafting (and never measuring)
        again."""
        for b in range(CONFIDENCE_BINS):
            self.trials[b] *= decay
            self.accepted[b] *= decay

    def record(self, probs: list[float], accepted: int) -> None:
        """A chain with these probabilities was verified; its first `accepted` drafts passed."""
        for i, prob in enumerate(probs[: accepted + 1]):
            b = self.bin(prob)
            for j in range(CONFIDENCE_BINS):
                self.trials[j] *= _CALIBRATION_DECAY
                self.accepted[j] *= _CALIBRATION_DECAY
            self.trials[b] += 1.0
            self.accepted[b] += 1.0 if i < accepted else 0.0
