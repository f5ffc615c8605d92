"""RequestRecord: what happened to one request, in seconds from the start of its run."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RequestRecord:
    """One request's outcome.

    `chunk_times[i]` is when the i-th streamed chunk carrying output arrived and
    `chunk_tokens[i]` how many tokens it carried (from continuous usage stats when the
    server sends them, else 1 per chunk with text). Failed requests keep their timing and
    error but are excluded from the latency statistics.
    """

    session_id: int
    turn: int
    scheduled_s: float
    start_s: float
    end_s: float
    success: bool
    error: str | None = None
    status: int | None = None
    chunk_times: tuple[float, ...] = ()
    chunk_tokens: tuple[int, ...] = ()
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    expected_input_tokens: int = 0
    expected_output_tokens: int = 0
    text: str = field(default="", repr=False)

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times[0] - self.start_s if self.chunk_times else None

    @property
    def latency_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def schedule_delay_s(self) -> float:
        """How late the request left compared with its plan (client or concurrency cap)."""
        return max(0.0, self.start_s - self.scheduled_s)

    @property
    def num_output_tokens(self) -> int:
        if self.output_tokens is not None:
            return self.output_tokens
        return sum(self.chunk_tokens)
