"""The server-side engine never leaves a caller waiting: a failing output loop or a dead
engine core ends every stream with EngineDeadError, admin calls fail fast, and the calls of
one request are admitted together or not at all."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from tokenmill.engine.arg_utils import build_engine_config
from tokenmill.engine.async_llm import AsyncLLM, GenerationRequest, QueueFullError
from tokenmill.engine.core_client import EngineDeadError
from tokenmill.sampling_params import RequestOutputKind, SamplingParams


def params(max_tokens: int = 200) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens, ignore_eos=True, output_kind=RequestOutputKind.DELTA
    )


async def started(model_dir, **kwargs) -> AsyncLLM:
    engine = AsyncLLM(build_engine_config(str(model_dir), kv_cache_memory_gib=0.05, **kwargs))
    await engine.start()
    return engine


class _Zeroes:
    """Records the scheduler stats the engine reports (the server's metrics)."""

    def __init__(self) -> None:
        self.last = None

    def on_scheduler_stats(self, stats) -> None:
        self.last = stats

    def on_tokens(self, timing, new_tokens, now) -> None:
        pass

    def on_finished(self, timing, finish_reasons, now) -> None:
        pass


def test_a_failing_output_loop_ends_every_request(tiny_llama_dir):
    async def main() -> None:
        engine = await started(tiny_llama_dir)
        engine.observer = observer = _Zeroes()
        try:
            stream = await engine.add_requests([GenerationRequest("a", [1, 2, 3], params())])
            await stream.__anext__()  # running

            def broken(outputs):
                raise RuntimeError("bug in output processing")

            engine.output_processor.process_outputs = broken
            with pytest.raises(EngineDeadError, match="output loop failed"):
                async with asyncio.timeout(30):
                    async for _ in stream:
                        pass
            assert not engine.healthy and engine.num_in_flight == 0
            assert observer.last.num_running_reqs == 0  # /metrics no longer shows it running
            with pytest.raises(EngineDeadError):
                await engine.add_requests([GenerationRequest("b", [1, 2], params())])
        finally:
            await engine.shutdown()

    asyncio.run(main())


def test_a_dead_engine_core_fails_calls_fast(tiny_llama_dir):
    async def main() -> None:
        engine = await started(tiny_llama_dir)
        try:
            stream = await engine.add_requests([GenerationRequest("a", [1, 2, 3], params())])
            await stream.__anext__()
            os.kill(engine.client.proc.pid, signal.SIGKILL)
            with pytest.raises(EngineDeadError):
                async with asyncio.timeout(30):
                    async for _ in stream:
                        pass
            t0 = time.monotonic()
            for method in ("kv_stats", "reset_prefix_cache"):
                with pytest.raises(EngineDeadError):
                    await engine.call_utility(method)
            assert time.monotonic() - t0 < 5
        finally:
            await engine.shutdown()

    asyncio.run(main())


def test_requests_of_one_call_are_admitted_together_or_not_at_all(tiny_llama_dir):
    async def main() -> None:
        engine = AsyncLLM(
            build_engine_config(str(tiny_llama_dir), kv_cache_memory_gib=0.05, max_num_seqs=2),
            max_queue_len=2,
        )
        await engine.start()
        try:
            never = [GenerationRequest(f"p{i}", [1, 2, 3], params()) for i in range(5)]
            with pytest.raises(ValueError, match="at most 4"):  # can never fit: a 400
                await engine.add_requests(never)
            assert engine.num_in_flight == 0 and not engine.output_processor.requests
            running = await engine.add_requests([GenerationRequest("r", [1, 2], params(2000))])
            not_now = [GenerationRequest(f"n{i}", [1, 2, 3], params()) for i in range(4)]
            with pytest.raises(QueueFullError):  # does not fit next to the running one: 503
                await engine.add_requests(not_now)
            assert engine.num_in_flight == 1 and list(engine.output_processor.requests) == ["r"]
            running.abort()
            assert engine.num_in_flight == 0 and not engine.output_processor.requests
            bad = [
                GenerationRequest("ok", [1, 2], params()),
                GenerationRequest("bad", [], params()),
            ]
            with pytest.raises(ValueError, match="prompt"):
                await engine.add_requests(bad)
            assert engine.num_in_flight == 0 and not engine.output_processor.requests
            # four fit: all four run, from the same step
            stream = await engine.add_requests(
                [GenerationRequest(f"q{i}", [5 + i, 6, 7], params(8)) for i in range(4)]
            )
            finals = await stream.final_outputs()
            assert sorted(finals) == ["q0", "q1", "q2", "q3"]
            assert engine.num_in_flight == 0
        finally:
            await engine.shutdown()

    asyncio.run(main())


def test_an_abandoned_stream_frees_its_request(tiny_llama_dir):
    async def main() -> None:
        engine = await started(tiny_llama_dir)
        try:
            stream = await engine.add_requests([GenerationRequest("a", [1, 2, 3], params(2000))])
            await stream.__anext__()
            stream.abort()  # synchronous: works from a task being cancelled
            assert engine.num_in_flight == 0
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                running, waiting, _ = await engine.call_utility("stats")
                if running == waiting == 0:
                    break
                await asyncio.sleep(0.1)
            assert (running, waiting) == (0, 0)
        finally:
            await engine.shutdown()

    asyncio.run(main())
