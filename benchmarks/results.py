"""Dated results files for the benchmark scripts.

A script adds the options with `add_arguments(parser)` and, once it has its final table,
either passes it as markdown to `write(name, text, args)` or prints it inside
`with capture(name, args):` (what is printed there is kept as text). A plain run then leaves
`benchmarks/results/<date>-<name>-<cpu>.md`: the date, the machine (CPU model, family and
model numbers, the flags that matter to the kernels, cores, memory, L3), the kernel switches
the run's engines get (their TOKENMILL_* variables), the code (tokenmill version and
commit), the exact command line and the table, ready to commit. `--results-dir DIR` writes
it elsewhere, `--no-results` not at all.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import io
import os
import platform
import re
import shlex
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from tokenmill.bench.machine import cpu_flags, cpu_model, git_commit

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO = RESULTS_DIR.parents[1]

# the flags that decide which kernels run (tokenmill/kernels/csrc: AVX-512 / AVX2 / VNNI / AMX)
KERNEL_FLAGS = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("results file")
    g.add_argument(
        "--results-dir",
        type=Path,
        default=RESULTS_DIR,
        metavar="DIR",
        help="where the dated results file (date, machine, command, table) is written "
        "(default: benchmarks/results/)",
    )
    g.add_argument("--no-results", action="store_true", help="write no results file")


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def memory_gib() -> float | None:
    text = _read("/proc/meminfo") or ""
    m = re.search(r"^MemTotal:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) / 2**20 if m else None


def cpu_id() -> str | None:
    """The CPU's family and model numbers (/proc/cpuinfo): what tells CPU generations apart
    where a VM names them all alike ("AMD EPYC": family 25 is Zen 3/4, 26 Zen 5)."""
    text = _read("/proc/cpuinfo") or ""
    family = re.search(r"^cpu family\s*:\s*(\d+)", text, re.M)
    model = re.search(r"^model\s*:\s*(\d+)", text, re.M)
    if family is None or model is None:
        return None
    return f"family {family.group(1)}, model {model.group(1)}"


def l3_cache() -> str | None:
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        if (_read(str(index / "level")) or "").strip() == "3":
            return (_read(str(index / "size")) or "").strip() or None
    return None


def kernel_switches() -> dict[str, Any]:
    """The kernel switches an engine this run starts gets where the script sets none
    (EngineConfig.kernel_config from the TOKENMILL_* variables, tokenmill/envs.py)."""
    from tokenmill.config import KernelConfig

    return dataclasses.asdict(KernelConfig.from_env())


def _switches(kernels: dict[str, Any]) -> str:
    word = {True: "on", False: "off", None: "measured"}  # None: the row limit
    return ", ".join(f"{k} {word[v] if v is None or isinstance(v, bool) else v}"
                     for k, v in kernels.items())  # fmt: skip


def machine_facts() -> dict[str, Any]:
    try:
        from importlib.metadata import version

        tm_version: str | None = version("tokenmill")
    except Exception:  # noqa: BLE001 (metadata is optional)
        tm_version = None
    flags = cpu_flags()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": cpu_model(),
        "cpu_id": cpu_id(),
        "cpu_flags": [f for f in KERNEL_FLAGS if f in flags],
        "cores": cores,
        "memory_gib": memory_gib(),
        "l3": l3_cache(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "tokenmill": tm_version,
        "commit": git_commit(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "kernels": kernel_switches(),
    }


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as typed from the repository root: the interpreter (relative when it is
    the checkout's own) and the script's arguments."""
    argv = list(sys.argv if argv is None else argv)
    python = Path(sys.executable)
    with contextlib.suppress(ValueError):
        python = python.relative_to(REPO)
    if argv and argv[0].endswith(".py"):
        script = Path(argv[0]).resolve()
        with contextlib.suppress(ValueError):
            argv[0] = str(script.relative_to(REPO))
    return shlex.join([str(python), *argv])


def slug(text: str) -> str:
    text = re.sub(r"\((R|TM)\)|\bCPU\b|@.*$|\b\d+-Core Processor\b", " ", text, flags=re.I)
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "unknown-cpu"


def render(
    name: str,
    table: str,
    *,
    command: str,
    when: dt.datetime,
    facts: dict[str, Any],
    title: str | None = None,
    notes: Sequence[str] = (),
) -> str:
    """The results file's markdown."""
    load = facts.get("load_average")
    machine = facts["cpu"]
    if facts.get("cpu_id"):
        machine += f" ({facts['cpu_id']})"
    machine += f", {facts['cores']} cores"
    if facts.get("memory_gib"):
        machine += f", {facts['memory_gib']:.0f} GiB"
    if facts.get("l3"):
        machine += f", L3 {facts['l3']}"
    software = f"tokenmill {facts.get('tokenmill') or '?'}"
    if facts.get("commit"):
        software += f" (commit {facts['commit']})"
    software += f", Python {facts['python']}, {facts['os']}"
    rows = [
        ("date", when.strftime("%Y-%m-%d %H:%M UTC")),
        ("machine", machine),
        ("CPU flags", ", ".join(facts.get("cpu_flags") or []) or "none of the kernels' flags"),
        ("software", software),
    ]
    if facts.get("kernels"):
        rows.insert(3, ("kernel switches", _switches(facts["kernels"])))
    if load:
        rows.append(("load average at the end", " / ".join(f"{x:.2f}" for x in load)))
    lines = [f"# {title or name}", ""]
    lines += [f"- **{k}**: {v}" for k, v in rows]
    lines += ["", "Command (from the repository root):", "", "```bash", command, "```", ""]
    body = table.strip("\n")
    lines += [body, ""]
    if notes:
        lines += [*notes, ""]
    return "\n".join(lines)


def _free_path(directory: Path, stem: str) -> Path:
    path = directory / f"{stem}.md"
    n = 2
    while path.exists():
        path = directory / f"{stem}-{n}.md"
        n += 1
    return path


def write(
    name: str,
    table: str,
    args: argparse.Namespace | None = None,
    *,
    title: str | None = None,
    notes: Sequence[str] = (),
    argv: Sequence[str] | None = None,
    results_dir: Path | None = None,
    when: dt.datetime | None = None,
    facts: dict[str, Any] | None = None,
) -> Path | None:
    """Writes `<dir>/<date>-<name>-<cpu>.md` (never over an existing file: `-2`, `-3`, ...)
    and returns its path; None with `--no-results`. `table` is markdown (a table, or any
    text the script prints as its result)."""
    if args is not None and getattr(args, "no_results", False):
        return None
    directory = Path(results_dir or getattr(args, "results_dir", None) or RESULTS_DIR)
    when = when or dt.datetime.now(dt.UTC)
    facts = facts or machine_facts()
    text = render(
        name, table, command=command_line(argv), when=when, facts=facts, title=title, notes=notes
    )
    directory.mkdir(parents=True, exist_ok=True)
    path = _free_path(directory, f"{when:%Y-%m-%d}-{slug(name)}-{slug(facts['cpu'])}")
    path.write_text(text)
    print(f"results file: {path}", file=sys.stderr)
    return path


def text_block(text: str) -> str:
    """Printed output as a fenced block (escape codes removed)."""
    clean = "\n".join(line.rstrip() for line in _ANSI.sub("", text).strip("\n").splitlines())
    return f"```text\n{clean}\n```"


class _Tee(io.TextIOBase):
    def __init__(self, out: TextIO) -> None:
        self.out, self.buffer_ = out, io.StringIO()

    def write(self, s: str) -> int:
        self.buffer_.write(s)
        return self.out.write(s)

    def flush(self) -> None:
        self.out.flush()

    def isatty(self) -> bool:
        return self.out.isatty()

    def fileno(self) -> int:
        return self.out.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.out, "encoding", "utf-8")


@contextlib.contextmanager
def printed() -> Iterator[io.StringIO]:
    """Everything printed to stdout inside the block still reaches stdout and is kept in the
    buffer this yields (for a table printed in parts: `write(name, text_block(...))`)."""
    tee = _Tee(sys.stdout)
    previous, sys.stdout = sys.stdout, tee
    try:
        yield tee.buffer_
    finally:
        sys.stdout = previous


@contextlib.contextmanager
def capture(
    name: str, args: argparse.Namespace | None = None, **kwargs: Any
) -> Iterator[io.StringIO]:
    """Everything printed to stdout inside the block still reaches stdout, and becomes the
    results file's table (as text) when the block ends without an error."""
    with printed() as buffer:
        yield buffer
    write(name, text_block(buffer.getvalue()), args, **kwargs)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table: the first column left-aligned, the others right-aligned."""
    lines = ["| " + " | ".join(headers) + " |", "| --- |" + " ---: |" * (len(headers) - 1)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
