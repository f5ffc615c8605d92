"""Phase-free continuous batching (vLLM v1): every request closes the gap between its
num_computed_tokens and its num_tokens, under one token budget per step. The same rule covers
prefill, chunked prefill, decode and recompute after preemption."""

from __future__ import annotations

import logging
from collections.abc import Callable

from tokenmill.config import SchedulerConfig
from tokenmill.kv.connector.base import SchedulerConnector
from tokenmill.kv.manager import KVCacheManager
from tokenmill.messages import EngineCoreOutput
from tokenmill.request import Request, RequestStatus
from tokenmill.scheduler.output import ModelRunnerOutput, ScheduledRequest, SchedulerOutput
from tokenmill.scheduler.queue import make_queue
from tokenmill.spec.drafter import Drafter
from tokenmill.stats import SchedulerStats
from tokenmill.structured.spec import CONSTRAINT_FAILED

logger = logging.getLogger(__name__)

# A constrained request gets its loops broken this many times, then it starts closing its
# output (see Request.closing); a loop after that cuts it off.
_MAX_LOOP_BREAKS = 2


def closing_reserve(max_tokens: int) -> int:
    """Tokens kept to close a constrained output before max_tokens."""
    return max(24, max_tokens // 4)


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        kv_manager: KVCacheManager,
        max_model_len: int,
        drafter: Drafter | None = None,
    ) -> None:
        self.config = config
        # speculative decoding: asked for a decoding request's drafts, told what was accepted
        self.drafter = drafter
        self.on_finished: Callable[[Request], None] | None = None  # completed requests
        self.kv = kv_manager
        self.max_model_len = max_model_len
        self.waiting = make_queue(config.policy)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        self.num_repetition_cutoffs = 0
        self.connector: SchedulerConnector | None = None  # prefill worker: transfer leases
        self.max_loras: int | None = None  # distinct LoRA adapters among running requests

    # ------------------------------------------------------------ requests in and out

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id: {request.request_id!r} is already in the engine")
        self.requests[request.request_id] = request
        self.waiting.add(request)

    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> list[Request]:
        """Abort (or fail) requests wherever they are; their blocks are freed at once."""
        done = []
        for rid in request_ids:
            request = self.requests.pop(rid, None)
            if request is None:
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            request.status = status
            self._free(request, status.name.lower())
            if self.drafter is not None:
                self.drafter.finish(rid)
            done.append(request)
        return done

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    # ------------------------------------------------------------ one step

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        scheduled: dict[str, ScheduledRequest] = {}

        spec_rows_left = 0
        if self.drafter is not None:
            decoding = [r for r in self.running if r.num_tokens - r.num_computed_tokens == 1]
            spec_rows_left = self.drafter.start_step(decoding)

        # 1) Running requests first: decodes and unfinished prefill chunks.
        for request in list(self.running):
            if budget <= 0:
                break
            if request.status != RequestStatus.RUNNING:
                continue  # preempted earlier in this step
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if num_new <= 0:
                continue
            if num_new == 1 and spec_rows_left > 0:
                slots = self._draft_slots(request, min(spec_rows_left, budget - 1))
                drafts = self.drafter.draft(request, slots)
                if drafts and self.kv.allocate_slots(request, 1 + len(drafts)):
                    scheduled[request.request_id] = ScheduledRequest(
                        request, 1 + len(drafts), [], drafts
                    )
                    budget -= 1 + len(drafts)
                    spec_rows_left -= len(drafts)
                    continue
            if num_new > 1:  # capped after the draft check: a 1-token share is still a prompt
                num_new = self._prefill_chunk(num_new)
            while not self.kv.allocate_slots(request, num_new):
                victim = self._pick_victim()
                budget += self._preempt(victim, scheduled)
                out.preempted_request_ids.append(victim.request_id)
                if victim is request:
                    break
            if request.status != RequestStatus.RUNNING:
                continue
            scheduled[request.request_id] = ScheduledRequest(request, num_new, [])
            budget -= num_new

        # 2) Waiting requests, while nothing had to be preempted this step.
        lora_waits: list[Request] = []  # their adapters wait for a running one to finish
        while (
            not out.preempted_request_ids
            and budget > 0
            and len(self.waiting)
            and len(self.running) < self.config.max_num_seqs
        ):
            request = self.waiting.peek()
            if not self._lora_fits(request):  # the requests behind it may still run (vLLM)
                lora_waits.append(self.waiting.pop())
                continue
            computed = self.kv.get_computed_blocks(request)
            num_new = request.num_tokens - computed.num_tokens
            if not self.config.enable_chunked_prefill and num_new > budget:
                break
            num_new = self._prefill_chunk(min(num_new, budget))
            request.num_computed_tokens = computed.num_tokens
            if not self.kv.allocate_slots(request, num_new, computed):
                request.num_computed_tokens = 0
                break
            if request.status == RequestStatus.WAITING:  # first admission (not a re-admission)
                request.num_cached_tokens = computed.num_local_tokens
                self.kv.record_lookup(request, computed)
            self.waiting.pop()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled[request.request_id] = ScheduledRequest(request, num_new, [])
            budget -= num_new

        for request in reversed(lora_waits):  # back at the front, in their order
            self.waiting.prepend(request)
        for sr in scheduled.values():
            sr.block_ids = self.kv.get_block_ids(sr.request.request_id)
        out.scheduled = list(scheduled.values())
        out.num_scheduled_tokens = sum(sr.num_new_tokens for sr in out.scheduled)
        return out

    def _lora_fits(self, request: Request) -> bool:
        """Its adapter is among the running ones, or there is room for one more
        (--max-loras: the adapters one batch may mix)."""
        if self.max_loras is None or request.lora_name is None:
            return True
        running = {r.lora_name for r in self.running if r.lora_name is not None}
        return request.lora_name in running or len(running) < self.max_loras

    def _prefill_chunk(self, num_new: int) -> int:
        """A prompt's share of one step: at most long_prefill_token_threshold when set."""
        cap = self.config.long_prefill_token_threshold
        return min(num_new, cap) if cap and self.config.enable_chunked_prefill else num_new

    def _draft_slots(self, request: Request, max_drafts: int) -> int:
        """How many drafts a decoding request may get: none while a loop-breaking ban is
        pending or constrained output is being closed; never past max_tokens or
        max_model_len, nor (constrained) past the point where it starts closing (a position
        verified there would be sampled without the closing rule)."""
        if request.banned_next or (request.grammar is not None and request.closing):
            return 0
        room = min(
            max_drafts,
            request.max_tokens - request.num_output_tokens - 1,
            self.max_model_len - request.num_tokens,
        )
        if request.grammar is not None:
            room = min(room, self._tokens_before_closing(request) - 1)
        return max(room, 0)

    def _pick_victim(self) -> Request:
        if self.config.policy == "priority":
            return max(self.running, key=lambda r: (r.priority, r.arrival_time))
        return self.running[-1]

    def _preempt(self, request: Request, scheduled: dict[str, ScheduledRequest]) -> int:
        """Preempt by recompute: drop its KV, send it back to the front of the queue.
        Returns the token budget it had taken this step (0 if not scheduled yet)."""
        self.running.remove(request)
        self._free(request, "preempted")
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend(request)
        refund = scheduled.pop(request.request_id, None)
        return refund.num_new_tokens if refund else 0

    def update_from_output(
        self, sched: SchedulerOutput, result: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        outputs = []
        for sr in sched.scheduled:
            request = sr.request
            if request.is_finished:  # aborted while the step ran
                continue
            rid = request.request_id
            sampled = result.sampled_token_ids.get(rid, ())
            if sr.spec_token_ids:
                request.num_computed_tokens += len(sampled)
                self.drafter.verified(request, len(sr.spec_token_ids), len(sampled) - 1)
            else:
                request.num_computed_tokens += sr.num_new_tokens
            new_tokens: list[int] = []
            for token in sampled:
                request.append_output_token(token)
                new_tokens.append(token)
                # a loop break bans what comes next: later tokens of this run were sampled
                # without the ban
                if self._check_stop(request, token) or request.banned_next:
                    break
            if sr.spec_token_ids:
                # KV holds the accepted drafts; positions past the tokens kept (rejected, or
                # after a stop inside the accepted run) are recomputed later and their surplus
                # blocks go back to the pool now
                request.num_computed_tokens = min(
                    request.num_computed_tokens, request.num_tokens - 1
                )
                self.kv.trim(request)
            self.kv.cache_full_blocks(request)  # full blocks of computed (accepted) tokens
            prompt_lps = result.prompt_logprobs.get(rid)
            pooled = result.pooled.get(rid)
            if pooled is not None:  # a pooling request is done once its prompt is
                request.status = RequestStatus.FINISHED_STOPPED
            if not new_tokens and not prompt_lps and pooled is None:
                continue
            logprobs = result.logprobs.get(rid)
            outputs.append(
                EngineCoreOutput(
                    request_id=rid,
                    new_token_ids=new_tokens,
                    new_logprobs=logprobs[: len(new_tokens)] if logprobs else None,
                    prompt_logprobs=prompt_lps,
                    finish_reason=request.finish_reason,
                    stop_reason=request.stop_reason,
                    num_cached_tokens=request.num_cached_tokens,
                    first_scheduled_time=request.first_scheduled_time,
                    pooled=pooled,
                )
            )
            if request.is_finished:
                self.running.remove(request)
                if self.connector is None or not self.connector.request_finished(request):
                    self.kv.free(request)
                del self.requests[rid]
                if self.drafter is not None:
                    self.drafter.finish(rid)
                if self.on_finished is not None:
                    self.on_finished(request)
        return outputs

    def _free(self, request: Request, why: str) -> None:
        if self.connector is not None:
            self.connector.blocks_lost(request, why)
        self.kv.free(request)

    def _check_stop(self, request: Request, token: int) -> bool:
        num_out = request.num_output_tokens
        grammar_done = False
        if request.grammar is not None:
            if not request.grammar.consume_token(token):
                # The mask allowed the token, so the matcher itself broke (a resource limit):
                # fail the request; its output would no longer follow the constraint.
                reason = request.grammar.get_error().splitlines()[0] or f"token {token} rejected"
                logger.warning("request %s: grammar failed: %s", request.request_id, reason)
                request.status = RequestStatus.FINISHED_ERROR
                request.stop_reason = CONSTRAINT_FAILED + reason
                return True
            grammar_done = request.grammar.is_stopped()
        at_length = num_out >= request.max_tokens or request.num_tokens >= self.max_model_len
        if token in request.stop_token_ids and num_out >= request.sampling_params.min_tokens:
            request.status = RequestStatus.FINISHED_STOPPED
            request.stop_reason = None if token in request.eos_token_ids else token
        elif grammar_done:  # the constrained output is complete
            request.status = RequestStatus.FINISHED_STOPPED
        elif (
            request.repetition is not None
            and (period := request.repetition.update(request.output_token_ids))
            # like a stop token, a cut waits for min_tokens (benchmarks ask for exact lengths)
            and (request.grammar is not None or num_out >= request.sampling_params.min_tokens)
        ):
            if (
                request.grammar is not None
                and not at_length
                and (request.loop_breaks < _MAX_LOOP_BREAKS or not request.closing)
            ):
                # Constrained output must stay complete: break the loop instead of cutting it,
                # by banning the token that would continue the cycle; then start closing.
                request.banned_next = [request.output_token_ids[-period]]
                request.loop_breaks += 1
                request.closing = request.loop_breaks >= _MAX_LOOP_BREAKS
                request.repetition.reset()
                return False
            # Cut off. Constrained output that is not a complete document says so: "length",
            # never "stop" on output that does not parse.
            incomplete = request.grammar is not None and not request.grammar.is_accepting()
            request.status = (
                RequestStatus.FINISHED_LENGTH_CAPPED
                if incomplete
                else RequestStatus.FINISHED_STOPPED
            )
            request.stop_reason = "repetition"
            self.num_repetition_cutoffs += 1
        elif at_length:
            request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        else:
            if request.grammar is not None and not request.closing:
                request.closing = self._tokens_before_closing(request) <= 0
            return False
        return True

    def _tokens_before_closing(self, request: Request) -> int:
        """Output tokens a constrained request may still produce before it starts closing."""
        left = min(
            request.max_tokens - request.num_output_tokens,
            self.max_model_len - request.num_tokens,
        )
        return left - closing_reserve(request.max_tokens)

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            kv_cache_usage=self.kv.usage(),
            num_preemptions=self.num_preemptions,
            num_repetition_cutoffs=self.num_repetition_cutoffs,
            prefix_cache_queries=self.kv.stats.queries,
            prefix_cache_hits=self.kv.stats.hits,
            spec_decode=self.drafter.stats.copy() if self.drafter is not None else None,
        )
