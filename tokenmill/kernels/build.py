"""Compiles the C kernels once per machine (gcc, -march=native) and loads them with ctypes.

The shared object is cached under ~/.cache/tokenmill/kernels keyed by the source, the
compiler and the CPU, so a different machine gets its own build. Without a compiler the
engine falls back to pure torch (TOKENMILL_DISABLE_KERNELS=1 forces that).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

from tokenmill import envs
from tokenmill.cache_dirs import cache_root

logger = logging.getLogger(__name__)
_SOURCES = [
    Path(__file__).parent / "csrc" / name
    for name in (  # the longest to compile first (they compile side by side)
        "int_dot_group_p3.c",
        "int_dot_group_p2.c",
        "int_dot_gemm.c",
        "int_dot_group_p1.c",
        "quant_kernels.c",
        "decode_attention.c",
        "decode_attention_f16.c",
        "int_dot_kernels.c",
        "cpu_kernels.c",
        "prefill_attention.c",
        "prefill_attention_f16.c",
        "lora_kernels.c",
        "decode_layers.c",
        "draft_chain.c",
        "int_dot_amx.c",
    )
]
_HEADERS = sorted((Path(__file__).parent / "csrc").glob("*.h"))  # part of the cache key
_FLAGS = ["-O3", "-fopenmp", "-shared", "-fPIC", "-std=c11"]


def _cache_dir() -> Path:
    return cache_root() / "kernels"


def _cpu_signature() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return line
    except OSError:
        pass
    return platform.processor()


def _load_torch_openmp() -> None:
    """Loads the OpenMP runtime torch ships before the kernels, so both use one runtime
    (one thread pool) whichever is loaded first. Done by path: the engine core loads the
    kernels while it is still importing torch (model/prefetch.py)."""
    if "torch" in sys.modules:
        return
    spec = importlib.util.find_spec("torch")
    folder = Path(spec.submodule_search_locations[0]) / "lib" if spec and spec.origin else None
    runtime = folder / "libgomp.so.1" if folder else None
    if runtime is not None and runtime.exists():
        ctypes.CDLL(str(runtime), mode=ctypes.RTLD_GLOBAL)  # torch's libraries find it by soname
    else:  # a torch build with another runtime name: let torch load its own
        import torch  # noqa: F401


@lru_cache(maxsize=1)
def load_kernels() -> ctypes.CDLL | None:
    if envs.DISABLE_KERNELS.get():
        return None
    return build_kernels("native")


def build_kernels(march: str, defines: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The kernels built for `-march=<march>` ("native" for this CPU; tests build the AVX2
    and plain x86-64 variants too, and with `defines` such as TM_AMX_EMULATE), cached; None
    without a working compiler."""
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        logger.warning("no C compiler found: using the pure-torch kernels")
        return None
    flags = [f"-march={march}", *(f"-D{name}" for name in defines), *_FLAGS]
    source = b"".join(path.read_bytes() for path in [*_SOURCES, *_HEADERS])
    key = hashlib.sha256(
        source + " ".join([cc, *flags]).encode() + _cpu_signature().encode()
    ).hexdigest()[:16]
    target = _cache_dir() / f"cpu_kernels-{key}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            out = Path(tmp) / target.name
            error = _compile(cc, flags, Path(tmp), out)
            if error is not None:
                logger.warning("kernel build failed, using pure torch:\n%s", error[-2000:])
                return None
            os.replace(out, target)  # atomic: concurrent builders never see a partial file
    _load_torch_openmp()
    lib = ctypes.CDLL(str(target))
    _declare(lib)
    return lib


def _compile(cc: str, flags: list[str], tmp: Path, out: Path) -> str | None:
    """The sources compiled side by side (one compiler a core: a first start's build takes
    about half the time on 2 cores), then linked into `out`; the compiler's errors, or None."""

    def run(args: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run([cc, *args], capture_output=True, text=True)

    object_of = {path: str(tmp / f"{path.stem}.o") for path in _SOURCES}
    with ThreadPoolExecutor(max(1, min(len(_SOURCES), os.cpu_count() or 1))) as pool:
        compiled = list(
            pool.map(lambda path: run([*flags, "-c", str(path), "-o", object_of[path]]), _SOURCES)
        )
    failed = [proc.stderr for proc in compiled if proc.returncode != 0]
    if failed:
        return "\n".join(failed)
    linked = run([*flags, *object_of.values(), "-o", str(out), "-lm"])
    return linked.stderr if linked.returncode != 0 else None


def _declare(lib: ctypes.CDLL) -> None:
    p, i64, f32, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
    signatures = {
        "tm_has_vnni": [],
        "tm_int8_linear": [p, p, p, p, p, p, i64, i64, i64, p, i32, i32],
        **{
            name + suffix: argtypes
            for name, argtypes in (
                ("tm_paged_attention_decode", [p, p, i64, p, p, *[i64] * 6, f32, i64, p, i32]),
                ("tm_paged_attention_prefill", [
                    p, i64, p, i64, p, i64, p, p, i64, i64, i64, i64, i64, f32, i64, p, i32,
                ]),
            )
            for suffix in ("", "_f16")  # float32 and float16 KV pools
        },  # fmt: skip
        "tm_halves_to_floats": [p, i64, p],
        "tm_floats_to_halves": [p, i64, p, i32],
        "tm_rmsnorm": [p, p, i64, i64, f32, p, i32],
        "tm_rmsnorm_quant": [p, p, i64, i64, f32, p, p, i32],
        "tm_quantize_rows_strided": [p, i64, i64, i64, p, p, i32],
        "tm_silu_mul_quant": [p, i64, i64, p, p, i32],
        "tm_silu_mul_rows": [p, i64, i64, p, i32],
        "tm_gelu_tanh_mul_rows": [p, i64, i64, p, i32],
        "tm_dequant_i32": [p, p, p, p, i64, i64, i32, p, i32],
        "tm_rope_neox": [p, i64, i64, i64, i64, i64, p, p, p, i32],
        "tm_block_bytes": [i32],
        "tm_block_values": [i32],
        "tm_dequant_matrix": [p, i32, i64, i64, p, i32],
        "tm_dequant_matrix_t": [p, i32, i64, i64, p, i32],
        "tm_dequant_rows": [p, i32, i64, p, i64, p, i32],
        "tm_qlinear": [p, i64, i64, p, i32, i64, p, p, i32, i32],
        "tm_int_dot_kind": [],
        "tm_int_dot_amx_available": [],
        "tm_int_dot_set_amx": [i32],
        "tm_int_dot_supported": [i32, i64, i64],
        "tm_int_dot_repack": [p, i32, i64, i64, p],
        "tm_int_dot_repacked_bytes": [i32, i64, i64],
        "tm_int_dot_linear": [p, i64, i64, p, i32, i64, p, p, i32, i32, i32],
        "tm_int_dot_linear_reference": [p, i64, i64, p, i32, i64, p, i32],
        "tm_int_dot_gemm": [p, i64, i64, p, i32, i64, p, p, i32, i32, i32],
        "tm_int_dot_gemm_reference": [p, i64, i64, p, i32, i64, p, i32],
        "tm_int_dot_bound_table": [p, i32, i64, i64, p],
        "tm_int_dot_argmax": [p, i64, i64, p, i32, i64, p, p, i32, i32],
        "tm_decode_layers": [p, i64, p, p, p, i32],
        "tm_draft_chain": [p, p, i64, i64, p, p, f32, i32],
        "tm_lora_sgmv": [p, i64, p, i64, i64, i32, p, p, p, p, i32, p, p, i32],
    }
    int_results = (
        "tm_has_vnni",
        "tm_block_bytes",
        "tm_block_values",
        "tm_int_dot_kind",
        "tm_int_dot_amx_available",
        "tm_int_dot_supported",
    )
    for name, argtypes in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = i32 if name in int_results else None
    lib.tm_draft_chain.restype = i64  # drafts written
    lib.tm_int_dot_repacked_bytes.restype = i64
