"""Up to how many rows a step's packed layers run the integer-dot kernels rather than a float32
GEMM on the dequantized weight: measured on this machine, once.

Up to 32 rows (linear.INT_DOT_MAX_ROWS) the integer-dot kernels run, whatever the machine; past
them the integer-dot GEMM (8-, 16- or 24-bit activations: KernelConfig.int_dot_activation_bits),
and it is timed here against the fp32 GEMM. Which one wins past a few dozen rows depends on the CPU:
the integer-dot kernels' cost per row is flat (bound by `vpdpbusd`), the fp32 GEMM's falls as
rows grow, towards the fp32 FMA peak. On a 2-core AMD EPYC (Zen 4, oneDNN/MKL fp32 GEMM) the
24-bit kernel was already 1.3-3x faster on the embedded model's gate/up layer at 64-512 rows
and a 512-token prefill took 638 ms against 902; the 2-core Xeon measured even at 48 rows.

The first start on a machine times both kernels on one of the model's layers (its largest
below a size cap, so a few hundred milliseconds at most) at 64, 128, ... rows and keeps the
largest count up to which the integer-dot kernel was never slower; the answer is stored under
the cache directory, keyed by the CPU, the kernels build, the thread count and the layer's
format and shape, so later starts on the machine (and its numbers) do not change with a noisy
minute. `--int-dot-max-rows N` (or `any`; also $TOKENMILL_INT_DOT_MAX_ROWS) sets it instead
(benchmarks' A/B switch). Where the integer-dot kernel wins at any count, the float32 copies
kept for the GEMM are dropped (the embedded model's 525 MB).

On CPUs with AMX the integer-dot GEMM's 8- and 16-bit tiles can run on AMX tiles or on
AVX-512 VNNI (the same bits): the first start times the GEMM both ways on the same layer and
keeps the faster (amx_tiles), stored alike."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import torch

from tokenmill import envs
from tokenmill.cache_dirs import cache_root
from tokenmill.kernels import ops
from tokenmill.platform import cpu_model


class _Weight(Protocol):
    name: str
    rows: int
    cols: int


class TimedLayer(Protocol):
    """A packed layer as the timing sees it (model/linear.py's PackedLinear)."""

    weight: _Weight
    int_dot: object | None  # the integer-dot repack (None: the layer has no such kernel)
    activation_bits: int  # the integer-dot GEMM's activation precision
    float_linear: object | None  # the float copy for the GEMM (None: dequantized per call)

    def int_dot_rows(self, x: torch.Tensor) -> object: ...

    def gemm_rows(self, x: torch.Tensor) -> object: ...


logger = logging.getLogger(__name__)

CANDIDATE_ROWS = (64, 128, 256, 512, 1024)
# Past the largest candidate both costs grow in proportion: the winner there keeps winning.
UNLIMITED = 1 << 30
# The sample layer: the largest with at most this many weights (about 200 ms of timing).
_SAMPLE_MAX_WEIGHTS = 4 << 20
_REPEATS = 3
ENV = envs.INT_DOT_MAX_ROWS.name
# what ops.int_dot_kind() names, for reports
INT_DOT_KINDS = {3: "avx512_vnni_amx", 2: "avx512_vnni", 1: "avx2", 0: "plain_c"}


def row_setting(limit: int) -> int | str:
    """A row limit as KernelConfig.int_dot_max_rows writes it ("any": no limit)."""
    return envs.ANY_ROWS if limit >= UNLIMITED else limit


def cache_file() -> Path:
    return cache_root() / "calibration" / "int_dot_rows.json"


def choose_sample(linears: Sequence[TimedLayer]) -> TimedLayer | None:
    """The layer to time: one with both kernels, the largest within the size cap (else the
    smallest); None when no layer has both."""
    both = [x for x in linears if x.int_dot is not None]
    if not both:
        return None
    size = lambda x: x.weight.rows * x.weight.cols  # noqa: E731
    within = [x for x in both if size(x) <= _SAMPLE_MAX_WEIGHTS]
    return max(within, key=size) if within else min(both, key=size)


def machine_key(sample: TimedLayer) -> str:
    """What the measurement depends on: the CPU, the kernels build (its cache name holds the
    sources' and the CPU flags' hash), the threads, torch's version and the layer."""
    lib = ops.load_kernels()
    build = Path(getattr(lib, "_name", "none")).stem
    w = sample.weight
    return "|".join(
        [
            cpu_model(),
            build,
            f"threads={torch.get_num_threads()}",
            f"torch={torch.__version__}",
            f"{w.name}[{w.rows}x{w.cols}]",
            f"float_copy={sample.float_linear is not None}",
            f"activation_bits={sample.activation_bits}",
        ]
    )


def measure_limit(
    int_dot: Callable[[torch.Tensor], object],
    gemm: Callable[[torch.Tensor], object],
    cols: int,
    floor: int,
    candidates: Sequence[int] = CANDIDATE_ROWS,
) -> tuple[int, list[tuple[int, float, float]]]:
    """Times both kernels (best of a few runs after a warm-up) at each row count, smallest
    first, until the GEMM is faster: the largest count the integer-dot kernel still won (at
    least `floor`; UNLIMITED when it won at every one), and the timings."""
    generator = torch.Generator().manual_seed(0)
    timings: list[tuple[int, float, float]] = []
    limit = floor
    for rows in candidates:
        x = torch.randn(rows, cols, generator=generator)
        a, b = _best_times(int_dot, gemm, x)
        timings.append((rows, a, b))
        if a > b:
            return limit, timings
        limit = rows
    return UNLIMITED, timings


def _best_times(
    first: Callable[[torch.Tensor], object], second: Callable[[torch.Tensor], object], x
) -> tuple[float, float]:
    """Each kernel's best time on x, runs taking turns (a busy moment slows both)."""
    first(x), second(x)
    best = [float("inf"), float("inf")]
    for _ in range(_REPEATS):
        for i, kernel in enumerate((first, second)):
            start = time.perf_counter()
            kernel(x)
            best[i] = min(best[i], time.perf_counter() - start)
    return best[0], best[1]


def int_dot_row_limit(
    linears: Sequence[TimedLayer], floor: int, fixed: int | str | None = None
) -> int:
    """The row limit for these layers (at least `floor`, the decode rows' limit): `fixed`
    (KernelConfig.int_dot_max_rows: a number or "any"), else the one stored for this machine
    and sample layer, or measured now (and stored)."""
    if fixed is not None:
        return UNLIMITED if fixed == envs.ANY_ROWS else int(fixed)
    sample = choose_sample(linears)
    if sample is None:
        return floor
    key = machine_key(sample)
    return int(_stored_or_measured(key, lambda: _measure_row_limit(sample, floor, key)))


def _measure_row_limit(sample: TimedLayer, floor: int, key: str) -> int:
    limit, timings = measure_limit(sample.int_dot_rows, sample.gemm_rows, sample.weight.cols, floor)
    logger.info(
        "integer-dot kernel up to %s rows (%s; ms int-dot/GEMM by rows: %s)",
        "any number of" if limit == UNLIMITED else limit,
        key,
        ", ".join(f"{m}: {a * 1e3:.2f}/{b * 1e3:.2f}" for m, a, b in timings),
    )
    return limit


def amx_tiles(linears: Sequence[TimedLayer]) -> bool | None:
    """Where the kernels build has the GEMM's AMX tiles: whether they run (set here), as
    stored for this machine and sample layer or timed now against AVX-512 VNNI on the sample
    (64 and 512 rows, taking turns; on where faster in total). None without the tiles."""
    sample = choose_sample(linears)
    if sample is None or not ops.int_dot_amx_available():
        return None
    key = machine_key(sample) + "|amx_tiles"
    on = bool(_stored_or_measured(key, lambda: _time_amx_tiles(sample, key)))
    ops.set_int_dot_amx(on)
    return on


def _time_amx_tiles(sample: TimedLayer, key: str) -> bool:
    generator = torch.Generator().manual_seed(0)
    totals = [0.0, 0.0]
    for rows in (64, 512):
        x = torch.randn(rows, sample.weight.cols, generator=generator)
        times = _best_times(
            lambda x: _with_amx(True, sample.int_dot_rows, x),
            lambda x: _with_amx(False, sample.int_dot_rows, x),
            x,
        )
        totals = [totals[0] + times[0], totals[1] + times[1]]
    on = totals[0] < totals[1]
    logger.info(
        "integer-dot GEMM tiles on %s (%s; ms AMX/VNNI at 64 + 512 rows: %.2f/%.2f)",
        "AMX" if on else "AVX-512 VNNI", key, totals[0] * 1e3, totals[1] * 1e3,
    )  # fmt: skip
    return on


def _with_amx(on: bool, kernel: Callable[[torch.Tensor], object], x: torch.Tensor) -> object:
    ops.set_int_dot_amx(on)
    return kernel(x)


def _stored_or_measured(key: str, measure: Callable[[], object]) -> object:
    """This machine's answer stored under `key` (cache_file), else measure()'s, stored."""
    path = cache_file()
    stored = _read(path)
    if key not in stored:
        stored[key] = measure()
        _write(path, stored)
    return stored[key]


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)  # atomic: concurrent starts never read half a file
    except OSError as e:  # a read-only cache: measured again next start
        logger.warning("could not store the integer-dot row limit in %s: %s", path, e)
