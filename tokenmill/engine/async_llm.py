"""Asynchronous engine for the server: tokenization and detokenization in this process, the
engine core in another, outputs fanned out to one stream per HTTP request.

Every request of one HTTP call (the prompts of a /v1/completions list) is admitted at once
or not at all, and their outputs arrive on one OutputStream in engine order. A stream whose
caller goes away is aborted (its KV blocks are freed); if the engine core dies or the
output loop fails, every stream ends with EngineDeadError and /health turns 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from tokenmill.config import EngineConfig, kernels_in_force
from tokenmill.engine.core_client import EngineCoreClient, EngineDeadError
from tokenmill.engine.output_processor import OutputProcessor
from tokenmill.engine.processor import InputProcessor
from tokenmill.engine.startup import StartupProfile
from tokenmill.messages import EngineCoreOutputs
from tokenmill.model.model_files import ModelFiles, read_model_info
from tokenmill.outputs import RequestOutput
from tokenmill.pooling_params import PoolingParams
from tokenmill.sampling_params import SamplingParams
from tokenmill.stats import SchedulerStats
from tokenmill.structured.spec import CONSTRAINT_FAILED, ConstraintFailedError

logger = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """Too many requests in flight; the caller should retry later."""


class RequestFailedError(RuntimeError):
    """The engine failed this request (not the client's fault)."""


@dataclass
class RequestTiming:
    arrival: float
    num_prompt_tokens: int
    first_token: float | None = None
    last_token: float | None = None
    first_scheduled: float | None = None
    num_generated: int = 0
    itl: list[float] = field(default_factory=list)


class StatsObserver(Protocol):
    """Receives what metrics are made of (the server's Prometheus metrics implement it)."""

    def on_scheduler_stats(self, stats: SchedulerStats) -> None: ...
    def on_tokens(self, timing: RequestTiming, new_tokens: int, now: float) -> None: ...
    def on_finished(
        self, timing: RequestTiming, finish_reasons: list[str | None], now: float
    ) -> None: ...


@dataclass
class GenerationRequest:
    """One prompt to generate for (n samples of it)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt: str | None = None
    priority: int = 0
    cache_salt: str | None = None
    kv_transfer_params: dict | None = None  # prefill/decode disaggregation (the router's)
    pooling_params: PoolingParams | None = None  # an embedding: the prompt pooled, no tokens
    lora_name: str | None = None  # the LoRA adapter the request's `model` names


class OutputStream:
    """The outputs of the requests of one call, in the order the engine produces them."""

    def __init__(self, engine: AsyncLLM, request_ids: list[str]) -> None:
        self._engine = engine
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.pending = set(request_ids)  # not finished yet

    @property
    def finished(self) -> bool:
        return not self.pending

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self

    async def __anext__(self) -> RequestOutput:
        if not self.pending:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        if item.finished:
            self.pending.discard(item.request_id)
            errors = [c for c in item.outputs if c.finish_reason == "error"]
            if errors:
                reason = str(errors[0].stop_reason or "the engine failed this request")
                if reason.startswith(CONSTRAINT_FAILED):
                    raise ConstraintFailedError(reason)
                raise RequestFailedError(reason)
        return item

    async def final_outputs(self) -> dict[str, RequestOutput]:
        """Waits for every request to finish; the last output of each."""
        last: dict[str, RequestOutput] = {}
        async for out in self:
            last[out.request_id] = out
        return last

    def abort(self) -> None:
        """Stops what is still running (the caller went away or failed). Synchronous, so it
        also works while the caller's task is being cancelled."""
        ids, self.pending = list(self.pending), set()
        for rid in ids:
            self._engine.abort(rid)


def warm_up_front_end(tokenizer, chat_template) -> None:
    """Compiles the chat template and runs the tokenizer once, so the first request does
    not pay for it."""
    from tokenmill.inputs.chat import render_chat

    tokenizer.hf  # noqa: B018  (built on first use: a broken tokenizer fails the start-up here)
    with contextlib.suppress(ValueError):  # a template that wants more than this
        _, ids = render_chat(chat_template, tokenizer, [{"role": "user", "content": "Hello"}])
        tokenizer.decode(ids)


class AsyncLLM:
    def __init__(
        self,
        config: EngineConfig,
        observer: StatsObserver | None = None,
        max_queue_len: int | None = None,
        log_level: str = "INFO",
        client: EngineCoreClient | None = None,
        profile: StartupProfile | None = None,
        model_files: ModelFiles | None = None,
    ) -> None:
        """`client`: an engine core started earlier (the server starts it first thing, so
        that it loads the model while this process imports and reads the tokenizer);
        `model_files`: the model's tokenizer and chat template, read and warmed up already."""
        self.config = config
        self.profile = profile
        self.client = client or EngineCoreClient(config, log_level)
        files = model_files or read_model_info(config.model_config.model)
        self.model_name = files.name
        self.tokenizer = files.tokenizer
        self.chat_template = files.chat_template
        self.arch = files.arch
        self.observer = observer
        self.output_processor = OutputProcessor(self.tokenizer)
        if model_files is None:
            warm_up_front_end(self.tokenizer, self.chat_template)
            if profile is not None:
                profile.mark("tokenizer and chat template")
        self.processor: InputProcessor | None = None
        self.max_model_len = 0
        self.engine_info: dict = {}
        self.stats = SchedulerStats()
        self.dead_reason: str | None = None
        self._streams: dict[str, OutputStream] = {}  # request id -> its call's stream
        self._num_seqs: dict[str, int] = {}  # request id -> sequences (n) in flight
        self._timing: dict[str, RequestTiming] = {}
        self._tasks: list[asyncio.Task] = []
        self._to_abort: list[str] = []  # engine-core ids, sent by _abort_sender
        self._abort_wakeup = asyncio.Event()
        # Bound on sequences in flight (running + waiting); None: unbounded.
        self.max_in_flight = (
            None if max_queue_len is None else config.scheduler_config.max_num_seqs + max_queue_len
        )

    async def start(self) -> None:
        info = await self.client.wait_ready()
        if self.profile is not None:
            self.profile.mark("wait for the engine core")
            for phase in info.get("startup", {}).get("phases", []):
                logger.debug("engine-core start-up: %s %.3f s", phase["name"], phase["seconds"])
        self.max_model_len = info["max_model_len"]
        self.engine_info = info
        self.config = kernels_in_force(self.config, info.get("kernels"))
        self.processor = InputProcessor(
            self.tokenizer, self.chat_template, self.max_model_len, info["vocab_size"]
        )
        self._tasks = [
            asyncio.create_task(self._output_loop()),
            asyncio.create_task(self._monitor()),
            asyncio.create_task(self._abort_sender()),
        ]

    @property
    def healthy(self) -> bool:
        return self.dead_reason is None and self.client.alive

    @property
    def num_in_flight(self) -> int:
        """Sequences (samples) in flight: a request with n = 4 counts 4."""
        return sum(self._num_seqs.values())

    def _check_alive(self) -> None:
        if not self.healthy:
            raise EngineDeadError(self.dead_reason or "the engine core is not running")

    # ------------------------------------------------------------ requests

    async def add_requests(self, requests: list[GenerationRequest]) -> OutputStream:
        """Admits all the requests or none: ValueError for a bad one, QueueFullError when
        they do not all fit, EngineDeadError when the engine core is gone."""
        self._check_alive()
        assert self.processor is not None, "call start() first"
        encoder_only = (self.engine_info.get("pooling") or {}).get("encoder_only", False)
        for r in requests:
            self.processor.validate(r.prompt_token_ids, r.params, r.pooling_params is not None)
            if encoder_only and r.pooling_params is None:
                raise ValueError(
                    "model: this is an encoder (embedding) model; it serves /v1/embeddings only"
                )
        wanted = sum(r.params.n for r in requests)
        if self.max_in_flight is not None and wanted > self.max_in_flight:
            # never admissible: a client mistake, not "busy" (a retry would loop forever)
            raise ValueError(
                f"n: the call asks for {wanted} sequences (prompts x n); the server takes at "
                f"most {self.max_in_flight} at once"
            )
        if self.max_in_flight is not None and self.num_in_flight + wanted > self.max_in_flight:
            raise QueueFullError(
                f"server busy: {self.num_in_flight} sequences in flight, {wanted} more asked "
                f"(limit {self.max_in_flight})"
            )
        stream = OutputStream(self, [r.request_id for r in requests])
        now = time.monotonic()
        core_requests = []
        registered: list[str] = []
        try:
            for r in requests:
                child_ids = self.output_processor.add_request(
                    r.request_id, r.prompt, r.prompt_token_ids, r.params
                )
                registered.append(r.request_id)
                self._streams[r.request_id] = stream
                self._num_seqs[r.request_id] = r.params.n
                self._timing[r.request_id] = RequestTiming(now, len(r.prompt_token_ids))
                core_requests += self.processor.make_requests(
                    r.request_id, r.prompt_token_ids, r.params, child_ids, now, r.priority,
                    r.cache_salt, r.kv_transfer_params, r.pooling_params, r.lora_name,
                )  # fmt: skip
            await self.client.add_requests(core_requests)
        except BaseException:
            for rid in registered:
                self.abort(rid)
            raise
        return stream

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prompt: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """One request's outputs; leaving the loop early aborts it."""
        stream = await self.add_requests(
            [GenerationRequest(request_id, prompt_token_ids, params, prompt, priority, cache_salt)]
        )
        try:
            async for out in stream:
                yield out
        finally:
            if not stream.finished:
                stream.abort()

    def abort(self, request_id: str) -> None:
        """Frees the request everywhere; safe to call twice or for a finished request."""
        self._release(request_id)
        self._abort_core(self.output_processor.abort_request(request_id))

    def _abort_core(self, core_ids: list[str]) -> None:
        if core_ids:
            self._to_abort += core_ids
            self._abort_wakeup.set()

    async def _abort_sender(self) -> None:
        while True:
            await self._abort_wakeup.wait()
            self._abort_wakeup.clear()
            ids, self._to_abort = self._to_abort, []
            if ids and self.healthy:
                with contextlib.suppress(EngineDeadError):  # a dead core holds nothing
                    await self.client.abort(ids)

    def _release(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self._num_seqs.pop(request_id, None)
        self._timing.pop(request_id, None)

    async def call_utility(self, method: str, *args):
        self._check_alive()
        return await self.client.call(method, *args)

    # ------------------------------------------------------------ background tasks

    async def _output_loop(self) -> None:
        try:
            while True:
                outs = await self.client.recv()
                if outs is not None:
                    await self._process(outs)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug here must not leave every request waiting forever
            logger.exception("the output loop failed")
            self._fail_all(f"the output loop failed: {type(e).__name__}: {e}")

    async def _process(self, outs: EngineCoreOutputs) -> None:
        self.stats = outs.stats
        if self.observer:
            self.observer.on_scheduler_stats(outs.stats)
        if not outs.outputs:
            return
        now = time.monotonic()
        for core_out in outs.outputs:
            rid = self.output_processor.child_to_parent.get(core_out.request_id, (None,))[0]
            timing = self._timing.get(rid) if rid else None
            if timing is not None:
                if timing.first_scheduled is None and core_out.first_scheduled_time is not None:
                    timing.first_scheduled = core_out.first_scheduled_time
                n = len(core_out.new_token_ids)
                if n and self.observer:
                    self.observer.on_tokens(timing, n, now)
                if n:
                    timing.first_token = timing.first_token or now
                    timing.last_token = now
                    timing.num_generated += n
        results, to_abort = self.output_processor.process_outputs(outs.outputs)
        for result in results:
            rid = result.request_id
            stream = self._streams.get(rid)
            if result.finished:
                if self.observer and rid in self._timing:
                    reasons = [c.finish_reason for c in result.outputs]
                    self.observer.on_finished(self._timing[rid], reasons, now)
                self._release(rid)
            if stream is not None:
                stream._queue.put_nowait(result)
        self._abort_core(to_abort)

    async def _monitor(self) -> None:
        while self.client.alive and self.dead_reason is None:
            await asyncio.sleep(0.2)
        if self.dead_reason is None:
            self._fail_all(f"the engine core process exited (code {self.client.proc.exitcode})")

    def _fail_all(self, reason: str) -> None:
        """The engine cannot serve any more: every request in flight ends with an error."""
        self.dead_reason = reason
        logger.error("%s; failing %d in-flight requests", reason, len(self._streams))
        error = EngineDeadError(reason)
        for stream in {id(s): s for s in self._streams.values()}.values():
            stream._queue.put_nowait(error)
        for rid in list(self._streams):
            self._release(rid)
            self.output_processor.abort_request(rid)
        self.client.fail_pending_calls(error)
        self.stats = SchedulerStats()
        if self.observer:
            self.observer.on_scheduler_stats(self.stats)

    async def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        self.client.shutdown()
