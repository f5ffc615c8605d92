"""API-process side of the engine core: starts the core process and talks to it over ZMQ."""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing as mp
import os
import tempfile
from typing import Any

import zmq
import zmq.asyncio

from tokenmill.config import EngineConfig
from tokenmill.engine.core_entry import STOP_SIGNAL, EarlyEngineCore, run_engine_core
from tokenmill.engine.serialization import decode_outputs, encode_request, pack, unpack
from tokenmill.messages import EngineCoreOutputs, EngineCoreRequest

logger = logging.getLogger(__name__)

_SEND_TIMEOUT_S = 10.0


class EngineDeadError(RuntimeError):
    """The engine-core process is gone; in-flight and new requests fail."""


class EngineCoreClient:
    def __init__(
        self,
        config: EngineConfig,
        log_level: str = "INFO",
        start_method: str = "spawn",
        early: EarlyEngineCore | None = None,
    ) -> None:
        """`start_method` "fork" saves the new interpreter's start (~0.2 s): only for a
        process that has no threads yet (`serve` right after parsing its arguments).
        `early`: a core forked before the arguments were parsed, importing meanwhile. The
        core starts before this process's ZMQ context exists (its sockets reconnect until
        these are bound)."""
        self._dir = tempfile.TemporaryDirectory(prefix="tokenmill-")
        input_addr = f"ipc://{self._dir.name}/input"
        output_addr = f"ipc://{self._dir.name}/output"
        args = (config, input_addr, output_addr, log_level)
        if early is not None:
            self.proc = early.proc
            early.start(*args)
        else:
            self.proc = mp.get_context(start_method).Process(
                target=run_engine_core,
                args=args,
                kwargs={"parent": os.getpid()},
                name="tokenmill-engine-core",
                daemon=True,
            )
            self.proc.start()
        self.ctx = zmq.asyncio.Context()
        self.input = self.ctx.socket(zmq.PUSH)
        self.input.bind(input_addr)
        self.output = self.ctx.socket(zmq.PULL)
        self.output.bind(output_addr)
        self._calls: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()

    @property
    def alive(self) -> bool:
        return self.proc.is_alive()

    async def wait_ready(self, timeout: float = 600.0) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if await self.output.poll(200):
                kind, payload = await self.output.recv_multipart()
                if kind == b"READY":
                    return unpack(payload)
                if kind == b"ERROR":
                    # The core exits by itself after reporting: let it finish, so it is not
                    # killed mid-exit with the API process and its last output comes first.
                    await loop.run_in_executor(None, self.proc.join, 5.0)
                    text = payload.decode(errors="replace")
                    sep = "\n" if "\n" in text.strip() else " "
                    raise EngineDeadError(f"engine core failed to start:{sep}{text.strip()}")
            elif not self.alive:
                raise EngineDeadError(
                    f"engine core exited during start-up (exit code {self.proc.exitcode})"
                )
        raise EngineDeadError("engine core did not become ready in time")

    async def _send(self, frames: list[bytes], timeout: float = _SEND_TIMEOUT_S) -> None:
        """Sends one message; a core that cannot take it (dead, wedged) is an EngineDeadError,
        never a send that waits forever."""
        if not self.alive:
            raise EngineDeadError(
                f"the engine core is not running (exit code {self.proc.exitcode})"
            )
        try:
            await asyncio.wait_for(self.input.send_multipart(frames), timeout)
        except TimeoutError:
            raise EngineDeadError(
                f"the engine core did not take a message in {timeout} s"
            ) from None

    async def add_requests(self, reqs: list[EngineCoreRequest]) -> None:
        """One message for all: the core admits them in the same step. Each id travels in a
        frame of its own, so the core can answer even an undecodable request."""
        frames = [b"ADD"]
        for req in reqs:
            frames += [req.request_id.encode(), encode_request(req)]
        await self._send(frames)

    async def abort(self, request_ids: list[str]) -> None:
        if request_ids and self.alive:
            await self._send([b"ABORT", pack(request_ids)])

    async def call(self, method: str, *args: Any, timeout: float = 30.0) -> Any:
        """A utility call answered by the core loop (results come back through recv()); the
        timeout covers the send as well as the answer."""
        call_id = next(self._call_ids)
        fut = asyncio.get_running_loop().create_future()
        self._calls[call_id] = fut

        async def roundtrip() -> Any:
            await self._send([b"UTIL", pack([call_id, method, list(args)])], timeout)
            return await fut

        try:
            return await asyncio.wait_for(roundtrip(), timeout)
        except TimeoutError:
            raise EngineDeadError(
                f"the engine core did not answer {method!r} in {timeout} s"
            ) from None
        finally:
            self._calls.pop(call_id, None)

    async def recv(self, timeout_ms: int = 200) -> EngineCoreOutputs | None:
        """The next batch of outputs, or None if nothing arrived within the timeout."""
        if not await self.output.poll(timeout_ms):
            return None
        kind, payload = await self.output.recv_multipart()
        if kind == b"OUT":
            return decode_outputs(payload)
        if kind == b"UTIL":
            call_id, ok, result = unpack(payload)
            fut = self._calls.get(call_id)
            if fut is not None and not fut.done():
                fut.set_result(result) if ok else fut.set_exception(RuntimeError(result))
        return None

    def fail_pending_calls(self, error: Exception) -> None:
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(error)

    def shutdown(self, timeout: float = 5.0) -> None:
        if self.proc.is_alive():
            os.kill(self.proc.pid, STOP_SIGNAL)  # the core unwinds and exits at once
            self.proc.join(timeout)
        if self.proc.is_alive():
            os.kill(self.proc.pid, 9)
        self.input.close(linger=0)
        self.output.close(linger=0)
        self.ctx.term()
        self._dir.cleanup()
