"""Live progress bar (rich) for a run: requests done, errors, elapsed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from tokenmill.bench.record import RequestRecord


@contextmanager
def progress_bar(
    label: str, total: int, console: Console | None = None, enabled: bool = True
) -> Iterator[Callable[[RequestRecord], None]]:
    """Yields an on_done callback that advances the bar (a no-op when disabled)."""
    if not enabled:
        yield lambda _rec: None
        return
    errors = 0
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("errors {task.fields[errors]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task(label, total=total, errors=0)

        def on_done(rec: RequestRecord) -> None:
            nonlocal errors
            errors += not rec.success
            progress.update(task, advance=1, errors=errors)

        yield on_done
