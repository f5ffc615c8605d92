"""Where batch files and batches are kept, how large they may be, how hard the runner may
push the engine, and the `serve` flags that set it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from tokenmill.server.database import MEMORY, check_database, default_database_path

OFF = "off"
MIB = 1 << 20
# Below interactive requests (priority 0 unless a client says otherwise): the priority policy
# admits them first and preempts batch lines first.
BATCH_PRIORITY = 1000


@dataclass(frozen=True)
class BatchConfig:
    # None: the response store's file when it is one, else the server database; "off": no
    # Batch API (its routes answer 404)
    path: str | None = None
    files_dir: str | None = None  # None: files/ beside the database
    max_file_bytes: int = 200 * MIB  # OpenAI's batch input limit
    max_total_bytes: int = 10 * 1024 * MIB  # every stored file together
    max_lines: int = 50_000  # OpenAI's
    max_active_batches: int = 64
    max_in_flight: int = 8  # lines in the engine while no interactive request runs
    busy_in_flight: int = 1  # ... and while one does
    priority: int = BATCH_PRIORITY

    def __post_init__(self) -> None:
        if self.path == MEMORY:
            raise ValueError("batch-store: must be a file (batches resume after a restart)")
        for name in ("max_file_bytes", "max_total_bytes", "max_lines", "max_active_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')}: must be >= 1")
        if self.max_in_flight < 1 or not 1 <= self.busy_in_flight <= self.max_in_flight:
            raise ValueError("batch-busy-in-flight: must be in [1, --batch-max-in-flight]")

    @property
    def enabled(self) -> bool:
        return self.path != OFF

    def database_path(self) -> str:
        return str(default_database_path()) if self.path is None else self.path

    def files_path(self) -> Path:
        if self.files_dir is not None:
            return Path(self.files_dir)
        return Path(self.database_path()).parent / "files"


def add_batch_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Batch API (/v1/files, /v1/batches)")
    g.add_argument(
        "--batch-store",
        default=None,
        metavar="PATH",
        help="SQLite file of files and batches (default: the --response-store file, else "
        f"{default_database_path()}); '{OFF}' turns the Batch API off",
    )
    g.add_argument(
        "--files-dir", default=None, metavar="DIR", help="uploaded and output files (default: "
        "files/ beside the batch store)",
    )  # fmt: skip
    g.add_argument(
        "--max-file-mib", type=float, default=BatchConfig.max_file_bytes / MIB, metavar="MIB",
        help="largest uploaded file (default: 200, as OpenAI)",
    )  # fmt: skip
    g.add_argument(
        "--files-max-total-gib", type=float, default=BatchConfig.max_total_bytes / 1024 / MIB,
        metavar="GIB", help="all stored files together (default: 10)",
    )  # fmt: skip
    g.add_argument(
        "--batch-max-lines", type=int, default=BatchConfig.max_lines, metavar="N",
        help="most requests in one batch file (default: 50000, as OpenAI)",
    )  # fmt: skip
    g.add_argument(
        "--batch-max-in-flight", type=int, default=BatchConfig.max_in_flight, metavar="N",
        help="batch lines in the engine at once while no interactive request runs",
    )  # fmt: skip
    g.add_argument(
        "--batch-busy-in-flight", type=int, default=BatchConfig.busy_in_flight, metavar="N",
        help="batch lines in the engine at once while interactive requests run (their "
        "latency is what this trades against batch throughput)",
    )  # fmt: skip
    g.add_argument(
        "--batch-priority", type=int, default=BATCH_PRIORITY, metavar="P",
        help="scheduler priority of batch lines (lower runs first; interactive default 0)",
    )  # fmt: skip


def batch_config(args: argparse.Namespace) -> BatchConfig:
    """The flags' config, its database checked now (a clear error before the engine starts)."""
    path = args.batch_store
    if path is None and args.response_store not in (None, OFF, MEMORY):
        path = args.response_store  # the server's one database file
    config = BatchConfig(
        path=path,
        files_dir=args.files_dir,
        max_file_bytes=int(args.max_file_mib * MIB),
        max_total_bytes=int(args.files_max_total_gib * 1024 * MIB),
        max_lines=args.batch_max_lines,
        max_in_flight=args.batch_max_in_flight,
        busy_in_flight=args.batch_busy_in_flight,
        priority=args.batch_priority,
    )
    if config.enabled:
        check_database(config.database_path(), "batch-store")
        try:
            config.files_path().mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"batch-store: cannot open {config.database_path()}: {e}") from e
    return config
