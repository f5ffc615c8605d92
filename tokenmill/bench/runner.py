"""The async scheduler: releases a workload's sessions under a LoadSpec.

Open-loop loads (constant, poisson, throughput, trace) fire every session at its planned
time whatever earlier responses do: a dispatcher sleeps until each planned instant and
starts a task, so slow responses never delay later sends (no coordinated omission). A
`max_concurrency` cap, when given, makes requests wait for a slot; that wait shows up as
schedule delay (start − planned). Closed-loop `concurrency` runs N workers back to back.
Later turns of a multi-turn session go when the previous reply has arrived (plus
`turn_delay_s`); if a turn fails, the remaining turns are recorded as failed, not dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tokenmill.bench.client import Prepared
from tokenmill.bench.config import Endpoint, LoadSpec
from tokenmill.bench.record import RequestRecord
from tokenmill.bench.schedule import constant_arrivals, poisson_arrivals
from tokenmill.bench.workloads import Session, Workload

SendFn = Callable[[Prepared, float], Awaitable[RequestRecord]]
DoneFn = Callable[[RequestRecord], None]


def planned_offsets(sessions: tuple[Session, ...], load: LoadSpec, seed: int) -> list[float]:
    n = len(sessions)
    if load.kind == "constant":
        return constant_arrivals(n, float(load.rate or 0))
    if load.kind == "poisson":
        return poisson_arrivals(n, float(load.rate or 0), load.burstiness, seed)
    if load.kind == "trace":
        if any(s.arrival_s is None for s in sessions):
            raise ValueError("load: trace replay needs the trace workload (--workload trace)")
        return [float(s.arrival_s or 0.0) for s in sessions]
    return [0.0] * n  # throughput: all at once


def prepare(
    session: Session, i: int, history: list[tuple[str, str]], endpoint: Endpoint, scheduled: float
) -> Prepared:
    turn = session.turns[i]
    common = dict(
        session_id=session.id,
        turn=i,
        scheduled_s=scheduled,
        max_tokens=turn.output_tokens,
        expected_input_tokens=turn.input_tokens,
    )
    if endpoint == "chat":
        msgs: list[dict[str, Any]] = list(turn.context)
        for user, reply in history:
            msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        msgs.append({"role": "user", "content": turn.text})
        return Prepared(messages=tuple(msgs), **common)
    parts = [str(m.get("content", "")) for m in turn.context]
    for user, reply in history:
        parts += [user, reply]
    return Prepared(prompt="\n".join([*parts, turn.text]) if parts else turn.text, **common)


async def run_load(
    workload: Workload,
    load: LoadSpec,
    send: SendFn,
    *,
    endpoint: Endpoint = "completions",
    seed: int = 0,
    max_duration_s: float | None = None,
    turn_delay_s: float = 0.0,
    on_done: DoneFn | None = None,
) -> list[RequestRecord]:
    """Runs the workload once; record times are seconds from the run's start."""
    t0 = time.perf_counter()
    records: list[RequestRecord] = []
    cap = asyncio.Semaphore(load.max_concurrency) if load.max_concurrency else None
    deadline = t0 + max_duration_s if max_duration_s else None

    def now() -> float:
        return time.perf_counter() - t0

    def done(rec: RequestRecord) -> None:
        records.append(rec)
        if on_done:
            on_done(rec)

    async def run_session(session: Session, scheduled: float) -> None:
        history: list[tuple[str, str]] = []
        for i, turn in enumerate(session.turns):
            req = prepare(session, i, history, endpoint, scheduled if i == 0 else now())
            async with cap if cap else contextlib.nullcontext():
                rec = await send(req, t0)
            done(rec)
            if not rec.success:
                for j in range(i + 1, len(session.turns)):
                    t = now()
                    done(
                        RequestRecord(
                            session.id, j, t, t, t, False, error=f"skipped: turn {i} failed",
                            expected_input_tokens=session.turns[j].input_tokens,
                            expected_output_tokens=session.turns[j].output_tokens,
                        )
                    )  # fmt: skip
                return
            history.append((turn.text, rec.text))
            if turn_delay_s and i + 1 < len(session.turns):
                await asyncio.sleep(turn_delay_s)

    if load.kind == "concurrency":
        queue = list(reversed(workload.sessions))

        async def worker() -> None:
            while queue and (deadline is None or time.perf_counter() < deadline):
                await run_session(queue.pop(), now())

        await asyncio.gather(*(worker() for _ in range(int(load.concurrency or 1))))
        return records

    tasks: list[asyncio.Task[None]] = []
    for session, offset in zip(
        workload.sessions, planned_offsets(workload.sessions, load, seed), strict=True
    ):
        if deadline is not None and t0 + offset > deadline:
            break
        delay = t0 + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(run_session(session, offset)))
    await asyncio.gather(*tasks)
    return records
