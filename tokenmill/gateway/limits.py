"""Per-key admission: requests/min and tokens/min token buckets, parallel requests, and a
USD budget per period with a hard stop.

Admission runs on the event loop with no await between check and take, so N concurrent
requests against a limit of M admit exactly M. Tokens are known only at the end: a request
is admitted while the tokens/min bucket is above zero and charged its real usage when it
ends (the bucket may go below zero; later requests then wait). The budget is a hard stop:
a request is admitted only when what was spent in the period (the ledger's sum, loaded once
per key and period, then kept here), the reservations of the requests in flight and its own
reservation (the most it can cost: its body's bytes as prompt tokens, at most one token a
byte, plus its max_tokens at the key's prices) fit in the budget.
Limits are per gateway process."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from tokenmill.gateway.config import KeyDefaults
from tokenmill.gateway.store.keys_table import StoredKey


class TokenBucket:
    def __init__(self, per_minute: int, now: float) -> None:
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0
        self.level = self.capacity
        self.stamp = now

    def _refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def wait_for(self, amount: float, now: float) -> float:
        """Seconds until `amount` can be taken (0: now)."""
        self._refill(now)
        return 0.0 if self.level >= amount else (amount - self.level) / self.rate

    def take(self, amount: float) -> None:
        self.level -= amount


def period_start(period: str | None, now: float) -> float:
    if period in (None, "total"):
        return 0.0
    t = datetime.fromtimestamp(now, UTC)
    day = t.replace(hour=0, minute=0, second=0, microsecond=0)
    return (day.replace(day=1) if period == "month" else day).timestamp()


@dataclass
class _KeyUsage:
    rpm: TokenBucket | None = None
    tpm: TokenBucket | None = None
    in_flight: int = 0
    period: float = -1.0
    spent: float = 0.0
    reserved: float = 0.0
    loading: asyncio.Future | None = None


@dataclass(frozen=True)
class Rejection:
    status: int
    message: str
    code: str
    type: str = "rate_limit_error"
    retry_after: int | None = None


@dataclass
class Admission:
    key_id: str
    reserved: float
    done: bool = field(default=False)


def _parallel_limit(key: StoredKey, defaults: KeyDefaults) -> int | None:
    return key.max_parallel if key.max_parallel is not None else defaults.max_parallel


class Limiter:
    def __init__(self, spend_since: Callable[[str, float], Awaitable[float]]) -> None:
        self.keys: dict[str, _KeyUsage] = {}
        self.spend_since = spend_since  # the ledger's spend of a key since a time

    def _usage(self, key_id: str) -> _KeyUsage:
        usage = self.keys.get(key_id)
        if usage is None:
            usage = self.keys[key_id] = _KeyUsage()
        return usage

    async def load_budget(self, key: StoredKey, now: float) -> None:
        """Loads the key's spend in the current period (once; concurrent callers share it)."""
        if key.budget_usd is None:
            return
        usage = self._usage(key.id)
        start = period_start(key.budget_period, now)
        while usage.period != start:
            if usage.loading is None:
                usage.loading = asyncio.ensure_future(self.spend_since(key.id, start))
                loading = usage.loading
                try:
                    spent = await loading
                finally:
                    usage.loading = None
                usage.period, usage.spent = start, spent
            else:
                await asyncio.shield(usage.loading)

    def ready_in(self, key: StoredKey, defaults: KeyDefaults, now: float | None = None) -> float:
        """Seconds until the key's rate limits would admit a request (0: now), taking nothing:
        a batch line waits this long instead of being refused for them."""
        now = time.monotonic() if now is None else now
        usage = self._usage(key.id)
        parallel = _parallel_limit(key, defaults)
        if parallel is not None and usage.in_flight >= parallel:
            return 1.0
        wait = 0.0
        for bucket, amount in ((usage.rpm, 1.0), (usage.tpm, 1e-9)):
            if bucket is not None:
                wait = max(wait, bucket.wait_for(amount, now))
        return wait

    def admit(
        self, key: StoredKey, defaults: KeyDefaults, estimate_usd: float, now: float | None = None
    ) -> Admission | Rejection:
        now = time.monotonic() if now is None else now
        usage = self._usage(key.id)
        rpm = key.rpm if key.rpm is not None else defaults.rpm
        tpm = key.tpm if key.tpm is not None else defaults.tpm
        parallel = _parallel_limit(key, defaults)
        if parallel is not None and usage.in_flight >= parallel:
            return Rejection(
                429,
                f"at most {parallel} requests in parallel for this key",
                "parallel_limit",
                retry_after=1,
            )
        if key.budget_usd is not None:
            left = key.budget_usd - usage.spent - usage.reserved
            if estimate_usd > left or left <= 0:
                period = key.budget_period or "total"
                spent = "is spent" if left <= 0 else (
                    f"has ${max(left, 0.0):.6g} left, and this request may cost up to "
                    f"${estimate_usd:.6g}"
                )  # fmt: skip
                return Rejection(
                    429,
                    f"this key's budget of ${key.budget_usd:g} per {period} {spent}",
                    "budget_exceeded",
                    "insufficient_quota",
                )
        for bucket_attr, limit, amount, what in (
            ("rpm", rpm, 1.0, "requests"),
            ("tpm", tpm, 1e-9, "tokens"),
        ):
            if limit is None:
                setattr(usage, bucket_attr, None)
                continue
            bucket = getattr(usage, bucket_attr)
            if bucket is None or bucket.capacity != limit:
                bucket = TokenBucket(limit, now)
                setattr(usage, bucket_attr, bucket)
            wait = bucket.wait_for(amount, now)
            if wait > 0:
                return Rejection(
                    429,
                    f"rate limit of {limit} {what} per minute reached for this key",
                    f"{what}_per_minute",
                    retry_after=max(1, math.ceil(wait)),
                )
        if usage.rpm is not None:
            usage.rpm.take(1.0)
        usage.in_flight += 1
        reserved = estimate_usd if key.budget_usd is not None else 0.0
        usage.reserved += reserved
        return Admission(key.id, reserved)

    def finish(self, admission: Admission, tokens: int, cost_usd: float) -> None:
        if admission.done:
            return
        admission.done = True
        usage = self._usage(admission.key_id)
        usage.in_flight -= 1
        usage.reserved = max(0.0, usage.reserved - admission.reserved)
        usage.spent += cost_usd
        if usage.tpm is not None:
            usage.tpm.take(float(tokens))
