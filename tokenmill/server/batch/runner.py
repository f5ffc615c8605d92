"""Runs batches in the server process: each unfinished batch is a task that feeds its lines
into the engine (at low priority, a bounded number in flight) and commits each line's result
as it comes. A server that stops mid-batch loses only the lines in flight; on start-up it
resumes every unfinished batch with the lines that have no result."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from pathlib import Path
from typing import Any

from tokenmill.server.batch.config import BatchConfig
from tokenmill.server.batch.execute import LineNotRun, run_line, sequences
from tokenmill.server.batch.files import FileStore, new_file_id
from tokenmill.server.batch.limiter import InFlightLimiter
from tokenmill.server.batch.lines import InputLine, dumps, error_line, read_lines, result_line
from tokenmill.server.batch.store import BatchStore
from tokenmill.server.state import ServerState, off_loop

logger = logging.getLogger(__name__)

_READ_AHEAD = 256  # lines read from the input file at a time
_BUSY_RETRY_S = 0.5


class _Interrupted(Exception):
    """The server cannot run lines now (it drains, or the engine is gone)."""


async def _relay(event: asyncio.Event, to: asyncio.Event) -> None:
    await event.wait()
    to.set()


class BatchRunner:
    def __init__(
        self, state: ServerState, store: BatchStore, files: FileStore, config: BatchConfig
    ) -> None:
        self.state = state
        self.store = store
        self.files = files
        self.config = config
        self.limiter = InFlightLimiter(state.engine, config)
        self.jobs: dict[str, asyncio.Task] = {}
        self.cancels: dict[str, asyncio.Event] = {}
        self.interrupted: dict[str, asyncio.Event] = {}  # a line could not run now
        self._watch: asyncio.Task | None = None
        self.gateway = None  # the app's, when it has one: lines run through it as their key

    async def start(self) -> None:
        """Resumes what a previous server left unfinished."""
        for batch in await off_loop(self.store.active):
            self.launch(batch["id"])
        self._watch = asyncio.create_task(self._stop_when_draining())

    def launch(self, batch_id: str) -> None:
        if batch_id in self.jobs:
            return
        self.cancels[batch_id] = asyncio.Event()
        self.interrupted[batch_id] = asyncio.Event()
        task = asyncio.create_task(self._run(batch_id))
        self.jobs[batch_id] = task

        def done(_t: asyncio.Task) -> None:
            self.jobs.pop(batch_id, None)
            self.cancels.pop(batch_id, None)
            self.interrupted.pop(batch_id, None)

        task.add_done_callback(done)

    def cancel(self, batch_id: str) -> None:
        """The batch (status cancelling) stops: lines in flight are aborted, then finalized."""
        if batch_id in self.cancels:
            self.cancels[batch_id].set()
        else:
            self.launch(batch_id)  # it finalizes as cancelled at once

    async def wait(self, batch_id: str) -> None:
        task = self.jobs.get(batch_id)
        if task is not None:
            await asyncio.wait({task})

    async def close(self) -> None:
        """Stops every batch where it is (unfinished: resumed by the next server)."""
        if self._watch is not None:
            self._watch.cancel()
        tasks = list(self.jobs.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def _stop_when_draining(self) -> None:
        while not self.state.draining:
            await asyncio.sleep(0.1)
        tasks = list(self.jobs.values())
        for task in tasks:
            task.cancel()  # lines in flight are aborted now, so the drain need not wait

    # ------------------------------------------------------------ one batch

    async def _run(self, batch_id: str) -> None:
        try:
            try:
                await self._run_batch(batch_id)
            except _Interrupted:
                if self.state.draining or self.state.engine.healthy:
                    raise
                # the engine core is gone for good: the batch ends, saying why
                await self._fail_rest(batch_id, "engine_dead", self._dead_reason())
        except (_Interrupted, asyncio.CancelledError):
            logger.info("batch %s stopped; it resumes when the server starts again", batch_id)
        except Exception:
            logger.exception("batch %s failed", batch_id)
            await off_loop(self._fail, batch_id, "server_error", "internal error running it")

    async def _run_batch(self, batch_id: str) -> None:
        batch = await off_loop(self.store.get, batch_id)
        if batch is None:
            return
        owner = await off_loop(self.store.owner, batch_id)
        status = batch["status"]
        if status == "validating":
            record = await off_loop(self.files.get, batch["input_file_id"], owner)
            if record is None:
                await off_loop(self._fail, batch_id, "file_not_found", "the input file is gone")
                return
            changes = {"status": "in_progress", "in_progress_at": int(time.time())}
            batch = await off_loop(self.store.update, batch_id, changes, ("validating",))
            status = batch["status"] if batch else "cancelling"
        if status == "in_progress":
            status = await self._run_lines(batch_id, owner)
        final = {"in_progress": "completed", "finalizing": "completed"}.get(status, status)
        if final == "expired":
            await self._expire_rest(batch_id, owner)
        await off_loop(self._finalize, batch_id, owner, final)

    async def _run_lines(self, batch_id: str, owner: str) -> str:
        """Runs the lines without a result; the status the batch ends with."""
        batch = await off_loop(self.store.get, batch_id)
        assert batch is not None
        path = await self._input_path(batch, owner)
        done = await off_loop(self.store.done_lines, batch_id)
        cancel, interrupted = self.cancels[batch_id], self.interrupted[batch_id]
        stop = asyncio.Event()  # either of the two
        watchers = [asyncio.create_task(_relay(e, stop)) for e in (cancel, interrupted)]
        pending: set[asyncio.Task] = set()
        lines = read_lines(path, self.state.settings.max_body_bytes)
        outcome = "in_progress"
        try:
            while outcome == "in_progress" and not stop.is_set():
                chunk = await off_loop(lambda: list(itertools.islice(lines, _READ_AHEAD)))
                if not chunk:
                    break
                for item in chunk:
                    if item.line in done:
                        continue
                    if time.time() > batch["expires_at"]:
                        outcome = "expired"
                        break
                    seqs = sequences(item.body)
                    if not await self.limiter.acquire(seqs, stop):
                        break
                    task = asyncio.create_task(self._line(batch_id, owner, item, seqs))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
            while pending and not stop.is_set():
                await asyncio.wait(
                    {*pending, watchers[0], watchers[1]}, return_when="FIRST_COMPLETED"
                )
        finally:
            for task in [*pending, *watchers]:
                task.cancel()  # a line's engine request is aborted: its KV blocks freed now
            if pending:
                await asyncio.wait(pending)
        if cancel.is_set():
            return "cancelling"
        if interrupted.is_set():
            raise _Interrupted()
        return outcome

    async def _line(self, batch_id: str, owner: str, item: InputLine, seqs: int) -> None:
        request_id = f"{batch_id}-{item.line}"
        try:
            while True:
                try:
                    result = await run_line(
                        self.state, item.url, item.body, request_id, self.config.priority,
                        self.gateway, owner,
                    )  # fmt: skip
                    break
                except LineNotRun as e:
                    waits = e.error.code == "server_busy" or e.retry_after_s is not None
                    if not waits or self.state.draining:
                        self.interrupted[batch_id].set()
                        return
                    await asyncio.sleep(e.retry_after_s or _BUSY_RETRY_S)
            line = result_line(item.custom_id, result.status_code, request_id, result.body)
            ok = result.status_code == 200
            write = asyncio.ensure_future(
                off_loop(self.store.record, batch_id, item.line, ok, dumps(line))
            )
            try:
                await asyncio.shield(write)
            except asyncio.CancelledError:  # the answer is logged: it is recorded too
                await write
                raise
        except Exception:
            logger.exception("batch %s line %d: its result was not recorded", batch_id, item.line)
            self.interrupted[batch_id].set()
        finally:
            self.limiter.release(seqs)

    async def _input_path(self, batch: dict[str, Any], owner: str) -> Path:
        record = await off_loop(self.files.get, batch["input_file_id"], owner)
        if record is None:
            raise FileNotFoundError(batch["input_file_id"])
        return Path(record.path)

    async def _expire_rest(self, batch_id: str, owner: str) -> None:
        """Lines never run get a batch_expired error line (as OpenAI's)."""
        await self._answer_rest(batch_id, owner, "batch_expired", "the batch expired first")

    async def _answer_rest(self, batch_id: str, owner: str, code: str, message: str) -> None:
        """Every line without a result gets an error line with this code and message."""
        batch = await off_loop(self.store.get, batch_id)
        assert batch is not None
        path = await self._input_path(batch, owner)

        def write() -> None:
            done = self.store.done_lines(batch_id)
            for item in read_lines(path, self.state.settings.max_body_bytes):
                if item.line not in done:
                    line = error_line(item.custom_id, code, message)
                    self.store.record(batch_id, item.line, False, dumps(line))

        await off_loop(write)

    def _dead_reason(self) -> str:
        reason = self.state.engine.dead_reason or "the engine core is not running"
        return f"the engine core stopped before the batch finished ({reason})"

    async def _fail_rest(self, batch_id: str, code: str, message: str) -> None:
        """The batch cannot go on: lines without a result get an error line saying why, and
        the batch ends as failed (the answered lines in its output file)."""
        logger.error("batch %s failed: %s", batch_id, message)
        owner = await off_loop(self.store.owner, batch_id)
        await self._answer_rest(batch_id, owner, code, message)
        await off_loop(self._finalize, batch_id, owner, "failed", _errors(code, message))

    # ------------------------------------------------------------ the end (blocking)

    def _finalize(
        self, batch_id: str, owner: str, final: str, errors: dict[str, Any] | None = None
    ) -> None:
        """Writes the output and error files, then the final status, counts and ids (and,
        for a failed batch, its `errors`)."""
        now = int(time.time())
        if final != "cancelling":
            self.store.update(batch_id, {"status": "finalizing", "finalizing_at": now})
        else:
            final = "cancelled"
        batch = self.store.get(batch_id)
        assert batch is not None
        changes: dict[str, Any] = {
            "status": final,
            f"{final}_at": int(time.time()),
            "request_counts": batch["request_counts"],
            "output_file_id": self._write_file(batch_id, owner, True),
            "error_file_id": self._write_file(batch_id, owner, False),
        }
        if errors is not None:
            changes["errors"] = errors
        self.store.update(batch_id, changes)
        self.store.forget_results(batch_id)
        logger.info("batch %s %s: %s", batch_id, final, changes["request_counts"])

    def _write_file(self, batch_id: str, owner: str, ok: bool) -> str | None:
        file_id = new_file_id()
        path = self.files.new_path(file_id)
        tmp = path.with_suffix(".tmp")
        count = 0
        with open(tmp, "w", encoding="utf-8") as f:
            for text in self.store.results(batch_id, ok):
                f.write(text + "\n")
                count += 1
        if not count:
            tmp.unlink()
            return None
        tmp.rename(path)
        name = f"{batch_id}_{'output' if ok else 'error'}.jsonl"
        self.files.create(owner, path, "batch_output", name, count, (), enforce_cap=False)
        return file_id

    def _fail(self, batch_id: str, code: str, message: str) -> None:
        changes = {
            "status": "failed",
            "failed_at": int(time.time()),
            "errors": _errors(code, message),
        }
        self.store.update(batch_id, changes)


def _errors(code: str, message: str) -> dict[str, Any]:
    """A batch's `errors` (OpenAI's list of one error, not tied to a line)."""
    error = {"code": code, "message": message, "line": None, "param": None}
    return {"object": "list", "data": [error]}
