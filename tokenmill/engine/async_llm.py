"""Asynchronous engine for the server: tokenization and detokenization in this process, the
engine core in another, outputs fanned out to one queue per request."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from tokenmill.config import EngineConfig
from tokenmill.engine.core_client import EngineCoreClient, EngineDeadError
from tokenmill.engine.core_types import EngineCoreOutputs, SchedulerStats
from tokenmill.engine.output_processor import OutputProcessor
from tokenmill.engine.processor import InputProcessor
from tokenmill.model.loader import load_model_files
from tokenmill.outputs import RequestOutput
from tokenmill.sampling_params import SamplingParams

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


class AsyncLLM:
    def __init__(
        self,
        config: EngineConfig,
        observer: StatsObserver | None = None,
        max_queue_len: int | None = None,
        log_level: str = "INFO",
    ) -> None:
        self.config = config
        files = load_model_files(config.model_config.model, with_weights=False)
        self.model_name = files.name
        self.tokenizer = files.tokenizer
        self.chat_template = files.chat_template
        self.arch = files.arch
        self.observer = observer
        self.output_processor = OutputProcessor(self.tokenizer)
        self.client = EngineCoreClient(config, log_level)
        self.processor: InputProcessor | None = None
        self.max_model_len = 0
        self.stats = SchedulerStats()
        self.dead_reason: str | None = None
        self._queues: dict[str, asyncio.Queue] = {}
        self._timing: dict[str, RequestTiming] = {}
        self._tasks: list[asyncio.Task] = []
        # Bound on sequences in flight (running + waiting); None: unbounded.
        self.max_in_flight = (
            None if max_queue_len is None else config.scheduler_config.max_num_seqs + max_queue_len
        )
        self._num_sequences = 0

    async def start(self) -> None:
        info = await self.client.wait_ready()
        self.max_model_len = info["max_model_len"]
        self.engine_info = info
        self.processor = InputProcessor(
            self.tokenizer, self.chat_template, self.max_model_len, info["vocab_size"]
        )
        self._tasks = [
            asyncio.create_task(self._output_loop()),
            asyncio.create_task(self._monitor()),
        ]

    @property
    def healthy(self) -> bool:
        return self.dead_reason is None and self.client.alive

    @property
    def num_in_flight(self) -> int:
        """Sequences (samples) in flight: a request with n = 4 counts 4."""
        return self._num_sequences

    # ------------------------------------------------------------ requests

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prompt: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        if not self.healthy:
            raise EngineDeadError(self.dead_reason or "the engine core is not running")
        assert self.processor is not None, "call start() first"
        self.processor.validate(prompt_token_ids, params)
        if self.max_in_flight is not None and self._num_sequences + params.n > self.max_in_flight:
            raise QueueFullError(
                f"server busy: {self._num_sequences} sequences in flight (limit {self.max_in_flight})"
            )
        child_ids = self.output_processor.add_request(request_id, prompt, prompt_token_ids, params)
        self._num_sequences += params.n
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = queue
        now = time.monotonic()
        self._timing[request_id] = RequestTiming(now, len(prompt_token_ids))
        finished = False
        try:
            await self.client.add_requests(
                self.processor.make_requests(
                    request_id, prompt_token_ids, params, child_ids, now, priority, cache_salt
                )
            )
            while True:
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                if item.finished:
                    finished = True
                    errors = [c for c in item.outputs if c.finish_reason == "error"]
                    if errors:
                        raise RequestFailedError(
                            str(errors[0].stop_reason or "the engine failed this request")
                        )
                yield item
                if finished:
                    return
        finally:
            self._num_sequences -= params.n
            self._queues.pop(request_id, None)
            self._timing.pop(request_id, None)
            if not finished:  # cancelled (client gone) or failed: free its KV blocks now
                await self._abort(request_id)

    async def abort(self, request_id: str) -> None:
        queue = self._queues.get(request_id)
        await self._abort(request_id)
        if queue is not None:
            queue.put_nowait(asyncio.CancelledError())

    async def _abort(self, request_id: str) -> None:
        ids = self.output_processor.abort_request(request_id)
        if ids and self.healthy:
            await self.client.abort(ids)

    async def call_utility(self, method: str, *args):
        return await self.client.call(method, *args)

    # ------------------------------------------------------------ background tasks

    async def _output_loop(self) -> None:
        while True:
            outs = await self.client.recv()
            if outs is not None:
                await self._process(outs)

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
        if to_abort:
            await self.client.abort(to_abort)
        for result in results:
            queue = self._queues.get(result.request_id)
            if result.finished and self.observer and result.request_id in self._timing:
                self.observer.on_finished(
                    self._timing[result.request_id], [c.finish_reason for c in result.outputs], now
                )
            if queue is not None:
                queue.put_nowait(result)

    async def _monitor(self) -> None:
        while self.client.alive:
            await asyncio.sleep(0.2)
        code = self.client.proc.exitcode
        self.dead_reason = f"the engine core process exited (code {code})"
        logger.error("%s; failing %d in-flight requests", self.dead_reason, len(self._queues))
        error = EngineDeadError(self.dead_reason)
        for queue in self._queues.values():
            queue.put_nowait(error)
        self.client.fail_pending_calls(error)

    async def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        self.client.shutdown()
