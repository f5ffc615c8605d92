"""Hand-made request records with known timings (seconds from the run's start)."""

from __future__ import annotations

from tokenmill.bench.record import RequestRecord

# A: four single-token chunks. TTFT 0.5, E2E 1.0, TPOT 0.5/3, ITL gaps 0.1, 0.2, 0.2.
REC_A = RequestRecord(
    session_id=0, turn=0, scheduled_s=0.0, start_s=0.0, end_s=1.0, success=True,
    chunk_times=(0.5, 0.6, 0.8, 1.0), chunk_tokens=(1, 1, 1, 1),
    prompt_tokens=10, output_tokens=4, cached_tokens=4,
)  # fmt: skip
# B: multi-token chunks. TTFT 0.2, E2E 1.2, TPOT 1.0/5 = 0.2,
# ITL: 0.3/3 three times, 0.6/2 twice.
REC_B = RequestRecord(
    session_id=1, turn=0, scheduled_s=1.0, start_s=1.0, end_s=2.2, success=True,
    chunk_times=(1.2, 1.5, 2.1), chunk_tokens=(1, 3, 2),
    prompt_tokens=20, output_tokens=6, cached_tokens=0,
)  # fmt: skip
# C: failed (HTTP 503) after waiting 0.3 s past its planned send; ends at 3.0.
REC_C = RequestRecord(
    session_id=2, turn=0, scheduled_s=0.2, start_s=0.5, end_s=3.0, success=False,
    error="HTTP 503: server busy", status=503,
)  # fmt: skip
# D: one output token: no TPOT, no ITL.
REC_D = RequestRecord(
    session_id=3, turn=0, scheduled_s=0.0, start_s=0.0, end_s=0.4, success=True,
    chunk_times=(0.3,), chunk_tokens=(1,), prompt_tokens=5, output_tokens=1, cached_tokens=0,
)  # fmt: skip
