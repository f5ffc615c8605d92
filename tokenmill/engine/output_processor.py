"""Front-end side of a request: detokenize, apply stop strings, build RequestOutputs, and
fold the n samples of one prompt into one output."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tokenmill.engine.detokenizer import IncrementalDetokenizer
from tokenmill.messages import EngineCoreOutput, PositionLogprobs
from tokenmill.model.tokenizer import Tokenizer
from tokenmill.outputs import CompletionOutput, Logprob, PositionLogprobDict, RequestOutput
from tokenmill.sampling_params import RequestOutputKind, SamplingParams


def to_logprob_dict(tokenizer: Tokenizer, entry: PositionLogprobs) -> PositionLogprobDict:
    ids, lps, rank = entry
    out: PositionLogprobDict = {}
    for i, (tid, lp) in enumerate(zip(ids, lps, strict=True)):
        if tid in out:
            continue
        out[tid] = Logprob(
            lp, rank if i == 0 else i, tokenizer.decode([tid], skip_special_tokens=False)
        )
    return out


@dataclass
class SampleState:
    """One of the n samples of a request (one engine-core request)."""

    index: int
    detok: IncrementalDetokenizer
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobDict] | None = None
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    sent_tokens: int = 0
    sent_logprobs: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    samples: list[SampleState]
    arrival_time: float
    prompt_logprobs: list[PositionLogprobDict | None] | None = None
    num_cached_tokens: int = 0
    first_token_time: float | None = None
    pooled: list[float] | None = None  # a pooling request's vector

    @property
    def finished(self) -> bool:
        return all(s.finished for s in self.samples)


def child_request_id(request_id: str, index: int, n: int) -> str:
    return request_id if n == 1 else f"{index}_{request_id}"


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.requests: dict[str, RequestState] = {}
        self.child_to_parent: dict[str, tuple[str, int]] = {}

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
    ) -> list[str]:
        """Registers the request; returns the engine-core ids of its n samples."""
        if request_id in self.requests:
            raise ValueError(f"request_id: {request_id!r} is already in use")
        samples = [
            SampleState(i, IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params))
            for i in range(params.n)
        ]
        for s in samples:
            if params.logprobs is not None:
                s.logprobs, s.cumulative_logprob = [], 0.0
        state = RequestState(
            request_id, prompt, prompt_token_ids, params, samples, time.monotonic()
        )
        if params.prompt_logprobs is not None:
            state.prompt_logprobs = [None]
        self.requests[request_id] = state
        child_ids = [child_request_id(request_id, i, params.n) for i in range(params.n)]
        for i, cid in enumerate(child_ids):
            self.child_to_parent[cid] = (request_id, i)
        return child_ids

    def child_ids(self, request_id: str) -> list[str]:
        state = self.requests.get(request_id)
        if state is None:
            return []
        n = len(state.samples)
        return [
            child_request_id(request_id, i, n) for i in range(n) if not state.samples[i].finished
        ]

    def process_outputs(
        self, outputs: list[EngineCoreOutput]
    ) -> tuple[list[RequestOutput], list[str]]:
        """Returns request outputs to hand out and engine-core ids to abort (stop strings)."""
        touched: dict[str, RequestState] = {}
        to_abort: list[str] = []
        for out in outputs:
            parent = self.child_to_parent.get(out.request_id)
            if parent is None:
                continue  # aborted by the front end meanwhile
            state = self.requests[parent[0]]
            sample = state.samples[parent[1]]
            if sample.finished:
                continue
            if self._update_sample(state, sample, out):
                to_abort.append(out.request_id)
            if sample.finished:
                del self.child_to_parent[out.request_id]
            touched[state.request_id] = state

        results = []
        for state in touched.values():
            result = self._make_output(state)
            if result is not None:
                results.append(result)
            if state.finished:
                del self.requests[state.request_id]
        return results, to_abort

    def _update_sample(
        self, state: RequestState, sample: SampleState, out: EngineCoreOutput
    ) -> bool:
        """Applies one core output; True when a stop string ended the sample (core must abort)."""
        if state.first_token_time is None and out.new_token_ids:
            state.first_token_time = time.monotonic()
        state.num_cached_tokens = out.num_cached_tokens
        if out.pooled is not None:
            state.pooled = out.pooled
        if out.prompt_logprobs and state.prompt_logprobs is not None and sample.index == 0:
            state.prompt_logprobs.extend(
                to_logprob_dict(self.tokenizer, e) for e in out.prompt_logprobs
            )
        # A final EOS / stop token ends the text without being rendered; a grammar that
        # completes or a loop cut-off also finish with "stop" but keep their last token.
        params = state.params
        stop_ids = set(params.stop_token_ids or ()) | (
            set() if params.ignore_eos else set(self.tokenizer.eos_token_ids)
        )
        stop_by_token = (
            out.finish_reason == "stop"
            and bool(out.new_token_ids)
            and out.new_token_ids[-1] in stop_ids
        )
        stop_string = sample.detok.update(out.new_token_ids, stop_terminated=stop_by_token)
        kept = sample.detok.tokens_kept  # up to the token that completed a stop string
        sample.token_ids.extend(out.new_token_ids[:kept])
        if out.new_logprobs and sample.logprobs is not None:
            for entry in out.new_logprobs[:kept]:
                sample.logprobs.append(to_logprob_dict(self.tokenizer, entry))
                sample.cumulative_logprob = (sample.cumulative_logprob or 0.0) + entry[1][0]
        if stop_string is not None:
            sample.finish_reason, sample.stop_reason = "stop", stop_string
            return not out.finished
        if out.finished:
            sample.finish_reason, sample.stop_reason = out.finish_reason, out.stop_reason
        return False

    def abort_request(self, request_id: str) -> list[str]:
        """Drops a request on the front-end side; returns the core ids still to abort."""
        state = self.requests.pop(request_id, None)
        if state is None:
            return []
        n = len(state.samples)
        ids = [child_request_id(request_id, i, n) for i in range(n)]
        for cid in ids:
            self.child_to_parent.pop(cid, None)
        return [cid for cid, s in zip(ids, state.samples, strict=True) if not s.finished]

    def _make_output(self, state: RequestState) -> RequestOutput | None:
        kind = state.params.output_kind
        finished = state.finished
        if kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        completions = []
        for s in state.samples:
            if kind == RequestOutputKind.DELTA:
                text = s.detok.get_delta(s.finished)
                token_ids = s.token_ids[s.sent_tokens :]
                logprobs = s.logprobs[s.sent_logprobs :] if s.logprobs is not None else None
                s.sent_tokens, s.sent_logprobs = len(s.token_ids), len(s.logprobs or ())
            else:
                text, token_ids, logprobs = s.detok.output_text, list(s.token_ids), s.logprobs
            completions.append(
                CompletionOutput(
                    s.index,
                    text,
                    token_ids,
                    s.cumulative_logprob,
                    logprobs,
                    s.finish_reason,
                    s.stop_reason,
                )
            )
        prompt_lps = state.prompt_logprobs
        metrics = {"arrival_time": state.arrival_time}
        if state.first_token_time is not None:
            metrics["first_token_time"] = state.first_token_time
        return RequestOutput(
            state.request_id,
            state.prompt,
            state.prompt_token_ids,
            prompt_lps,
            completions,
            finished,
            state.num_cached_tokens,
            metrics,
            state.pooled,
        )
