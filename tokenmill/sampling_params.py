"""Request-level generation knobs, validated on construction (vLLM's SamplingParams shape)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

from tokenmill.structured.spec import StructuredOutputsParams

_GREEDY_EPS = 1e-5
# Dividing logits by a tiny penalty overflows float32 (NaN probabilities).
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 0.01, 10.0


@dataclass(frozen=True)
class RepetitionDetection:
    """A cycle of `period` tokens (1..max_period) repeated `min_repeats` times, spanning at
    least `min_span` tokens, ends the sequence with stop_reason "repetition"."""

    max_period: int = 32
    min_repeats: int = 4
    min_span: int = 48

    def __post_init__(self) -> None:
        if self.max_period < 1 or self.min_repeats < 2 or self.min_span < 2:
            raise ValueError(
                "repetition_detection: needs max_period >= 1, min_repeats >= 2, min_span >= 2"
            )


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0  # every output carries the full text so far
    DELTA = 1  # every output carries only what is new
    FINAL_ONLY = 2  # one output, when the request finishes


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: all tokens
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16  # None: up to the context length
    min_tokens: int = 0
    logprobs: int | None = None  # top-k logprobs per output token (0: only the sampled one)
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    logit_bias: dict[int, float] | None = None
    structured_outputs: StructuredOutputsParams | None = None
    # Loop cut-off: end the sequence when its tail repeats a cycle of 1..max_period tokens
    # at least min_repeats times (None: the engine's default; False: off).
    repetition_detection: RepetitionDetection | bool | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # Filled by the engine from the tokenizer, not by users.
    extra_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._validate()
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0

    def _validate(self) -> None:
        def fail(name: str, reason: str) -> None:
            raise ValueError(f"{name}: {reason}")

        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        def is_num(v: Any) -> bool:  # finite: NaN and infinities poison a whole batch row
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        if not is_int(self.n) or self.n < 1:
            fail("n", f"must be an integer >= 1, got {self.n!r}")
        if not is_num(self.temperature) or self.temperature < 0:
            fail("temperature", f"must be a number >= 0, got {self.temperature!r}")
        if not is_num(self.top_p) or not 0 < self.top_p <= 1:
            fail("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if not is_int(self.top_k) or self.top_k < -1:
            fail("top_k", f"must be -1, 0 (disabled) or a positive integer, got {self.top_k!r}")
        if not is_num(self.min_p) or not 0 <= self.min_p <= 1:
            fail("min_p", f"must be in [0, 1], got {self.min_p!r}")
        if self.seed is not None and not is_int(self.seed):
            fail("seed", f"must be an integer, got {self.seed!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not is_num(value) or not -2 <= value <= 2:
                fail(name, f"must be in [-2, 2], got {value!r}")
        if not is_num(self.repetition_penalty) or not (
            MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY
        ):
            fail(
                "repetition_penalty",
                f"must be in [{MIN_REPETITION_PENALTY}, {MAX_REPETITION_PENALTY}], "
                f"got {self.repetition_penalty!r}",
            )
        if self.stop is not None:
            stops = [self.stop] if isinstance(self.stop, str) else self.stop
            if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) for s in stops):
                fail("stop", f"must be a string or a list of strings, got {self.stop!r}")
            if any(s == "" for s in stops):
                fail("stop", "stop strings must not be empty")
        if self.stop_token_ids is not None and (
            not isinstance(self.stop_token_ids, (list, tuple))
            or not all(is_int(t) for t in self.stop_token_ids)
        ):
            fail("stop_token_ids", f"must be a list of integers, got {self.stop_token_ids!r}")
        if self.max_tokens is not None and (not is_int(self.max_tokens) or self.max_tokens < 1):
            fail("max_tokens", f"must be an integer >= 1, got {self.max_tokens!r}")
        if not is_int(self.min_tokens) or self.min_tokens < 0:
            fail("min_tokens", f"must be an integer >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            fail("min_tokens", f"must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value < 0):
                fail(name, f"must be an integer >= 0, got {value!r}")
        if self.logit_bias is not None and (
            not isinstance(self.logit_bias, dict)
            or not all(is_int(k) and is_num(v) for k, v in self.logit_bias.items())
        ):
            fail("logit_bias", "must map token ids to numbers")
        if self.structured_outputs is not None and not isinstance(
            self.structured_outputs, StructuredOutputsParams
        ):
            fail("structured_outputs", "must be a StructuredOutputsParams")
        if self.repetition_detection not in (None, True, False) and not isinstance(
            self.repetition_detection, RepetitionDetection
        ):
            fail("repetition_detection", "must be a RepetitionDetection, true/false or None")
        if not isinstance(self.output_kind, RequestOutputKind):
            fail("output_kind", f"must be a RequestOutputKind, got {self.output_kind!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    @property
    def uses_penalties(self) -> bool:
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
        )

    @property
    def stop_buffer_length(self) -> int:
        """Characters a streamed delta holds back because they may start a stop string."""
        return max((len(s) for s in self.stop), default=1) - 1  # type: ignore[union-attr]

    def clone(self, **changes: Any) -> SamplingParams:
        values = {name: getattr(self, name) for name in self.__dataclass_fields__}
        values.update(changes)
        return SamplingParams(**values)
