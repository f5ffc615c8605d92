"""`tokenmill batch IN.jsonl OUT.jsonl`: a batch file run without a server. The lines go
through the same handlers as the served Batch API (an in-process engine, no HTTP), so a line
answers as it would served; OUT.jsonl gets one line per request, in OpenAI's batch output
format, in the order they finish (match them by custom_id): errors are lines whose `error`
is set."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from pathlib import Path
from typing import Any

from tokenmill.server.settings import DEFAULT_MAX_TOKENS, ServerSettings

MAX_LINE_BYTES = ServerSettings.max_body_bytes  # as serve's --max-request-body


def add_batch_parser(sub: Any, add_engine_args: Any) -> None:
    p = sub.add_parser(
        "batch",
        help="run an OpenAI Batch API file (JSONL) offline, no server: IN.jsonl -> OUT.jsonl",
    )
    p.add_argument("input", metavar="IN.jsonl", help="requests, one per line (OpenAI's format)")
    p.add_argument(
        "output", metavar="OUT.jsonl", help="results and errors, one per line (completion order)"
    )
    p.add_argument(
        "--max-in-flight", type=int, default=64, metavar="N", help="lines in the engine at once"
    )
    p.add_argument(
        "--default-max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
        help="max tokens of a chat line that gives none (capped by the context), as serve",
    )  # fmt: skip
    p.add_argument(
        "--served-model-name", action="append", default=None,
        help="model name(s) the lines may use (default: the model's own name)",
    )  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_engine_args(p)
    p.set_defaults(func=cmd_batch)


def cmd_batch(args: argparse.Namespace) -> int:
    from tokenmill.engine.arg_utils import EngineArgs
    from tokenmill.server.batch.lines import validate_file
    from tokenmill.server.errors import APIError

    if args.max_in_flight < 1:
        raise ValueError("max-in-flight: must be >= 1")
    if args.default_max_tokens < 1:
        raise ValueError("default-max-tokens: must be >= 1")
    try:
        summary = validate_file(args.input, MAX_LINE_BYTES, max_lines=1 << 62)
    except APIError as e:
        raise ValueError(f"{args.input}: {e.message}") from None
    _check_output(Path(args.input), Path(args.output))
    config = EngineArgs.from_cli_args(args).create_engine_config()
    failed = asyncio.run(_run(args, config, summary.lines))
    return 1 if failed == summary.lines else 0


async def _run(args: argparse.Namespace, config: Any, total: int) -> int:
    """Runs every line; the number of error lines."""
    from tokenmill.engine.async_llm import AsyncLLM
    from tokenmill.server.batch.execute import LineNotRun, run_line
    from tokenmill.server.batch.lines import dumps, new_line_id, read_lines, result_line
    from tokenmill.server.settings import ServerSettings
    from tokenmill.server.state import ServerState, off_loop

    level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
    engine = AsyncLLM(config, log_level=level)
    await engine.start()
    names = args.served_model_name or [engine.model_name]
    settings = ServerSettings(default_max_tokens=args.default_max_tokens)
    state = ServerState(engine, names, None, settings)  # type: ignore[arg-type]
    slots = asyncio.Semaphore(args.max_in_flight)
    failed = 0
    progress, task = _progress(total, args.no_progress)

    try:
        out_file = open(args.output, "w", encoding="utf-8")  # noqa: SIM115 (closed below)
    except OSError as e:  # the checks passed, the disk said no: the engine must stop too
        if progress is not None:
            progress.stop()
        await engine.shutdown()
        raise ValueError(f"output: {args.output}: {e.strerror}") from None
    with out_file as out:

        async def one(item) -> None:
            nonlocal failed
            request_id = new_line_id().replace("batch_req_", "req_")
            try:
                result = await run_line(state, item.url, item.body, request_id, 0)
                line = result_line(item.custom_id, result.status_code, request_id, result.body)
            except LineNotRun as e:  # the engine died: say so on the line
                line = result_line(item.custom_id, 503, request_id, e.error.body())
            finally:
                slots.release()
            failed += line["error"] is not None
            out.write(dumps(line) + "\n")
            if progress is not None:
                progress.update(task, advance=1, failed=failed)

        try:
            tasks = set()
            items = read_lines(args.input, MAX_LINE_BYTES)
            while (item := await off_loop(next, items, None)) is not None:
                await slots.acquire()
                t = asyncio.create_task(one(item))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(tasks)
        finally:
            if progress is not None:
                progress.stop()
            await engine.shutdown()
    return failed


def _check_output(source: Path, output: Path) -> None:
    """Before the model loads: OUT can be written and is not the input it would erase."""
    if output.exists() and output.resolve() == source.resolve():
        raise ValueError(f"output: {output} is the input file (writing it would erase it)")
    if output.is_dir():
        raise ValueError(f"output: {output} is a folder")
    if not output.parent.is_dir():
        raise ValueError(f"output: the folder {output.parent} does not exist")
    if not os.access(output.parent, os.W_OK) or (
        output.exists() and not os.access(output, os.W_OK)
    ):
        raise ValueError(f"output: {output} cannot be written")


def _progress(total: int, off: bool):
    if off:
        return None, None
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(
        TextColumn("batch"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[failed]} errors"), TimeElapsedColumn(), TimeRemainingColumn(),
    )  # fmt: skip
    task = progress.add_task("batch", total=total, failed=0)
    progress.start()
    return progress, task
