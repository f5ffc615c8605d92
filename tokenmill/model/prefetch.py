"""Start-up prefetch: the part of building a native-weights model that needs no torch, run
on a thread while the engine-core process imports torch (about a second, mostly on one
core; the API process starts on the other).

The thread reads the GGUF header, loads the native kernels, fuses the file's blocks as the
model fuses them (q/k/v, gate/up; q/k rows in rotate-half order) and runs what the native
method computes first: the embedding table in float32, the float32 copies for batched GEMMs
(within the dequant cache budget, in the method's order) and the integer-dot repacks. The
kernels release the GIL, so this overlaps the import. It runs at a lower priority, and the
first result the model asks for stops it after the one it is on.

Results are handed over by content: the model asks for an operation's result on a weight's
bytes (kind, format, shape, XXH3-128 of the bytes); what the prefetch did not prepare, or
prepared from other bytes, is computed as usual. A prefetch makes start-up faster, never
different. `--no-prefetch` (KernelConfig.prefetch; $TOKENMILL_PREFETCH=0) turns it off.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

# imported by whoever starts the prefetch, not on its low-priority thread: numpy starts its
# BLAS threads when imported, and they would keep that priority
import numpy as np
import xxhash

from tokenmill import envs
from tokenmill.model.gguf_layout import packed_rows, rope_permuted, unpermuted_row_order
from tokenmill.model.host_memory import anonymous_array
from tokenmill.platform import lower_thread_priority

if TYPE_CHECKING:
    import ctypes

    from tokenmill.config import EngineConfig
    from tokenmill.model.gguf_file import GGUFFile

logger = logging.getLogger(__name__)

# What the model asks for (ops.py computes the same from torch tensors):
ROWS = "rows"  # dequant_matrix: fp32 [rows, cols] (the embedding table)
FLOAT_T = "float_t"  # dequant_matrix_t: fp32 [cols, rows] (a batched GEMM's weight)
INT_DOT = "int_dot"  # int_dot_repack: uint8, the blocks regrouped for the decode GEMV


@dataclass(frozen=True)
class _Packed:
    """One packed weight as the model will see it: uint8 [rows, row_bytes]."""

    qtype: int
    rows: int
    cols: int
    data: np.ndarray


@dataclass
class _Slot:
    done: threading.Event = field(default_factory=threading.Event)
    value: np.ndarray | None = None


def content_key(kind: str, qtype: int, rows: int, cols: int, data: np.ndarray) -> tuple:
    data = np.ascontiguousarray(data)
    return (kind, qtype, rows, cols, xxhash.xxh3_128_intdigest(data))


class WeightPrefetch:
    def __init__(self, path: Path, float_budget_bytes: int, int_dot: bool = True):
        """`int_dot`: KernelConfig.int_dot (off: no integer-dot repacks to prepare)."""
        self.path = path
        self.float_budget_bytes = float_budget_bytes
        self.int_dot = int_dot
        self.seconds: dict[str, float] = {}  # prefetch step -> seconds, for the profile
        self.prepared = 0
        self.used = 0
        self._header_read = threading.Event()
        self._gguf: GGUFFile | None = None
        self._lock = threading.Lock()
        self._slots: dict[tuple, _Slot] = {}
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="weight-prefetch", daemon=True)

    def start(self) -> WeightPrefetch:
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        """Waits until the thread has prepared everything (or stopped)."""
        self._thread.join(timeout)

    # ------------------------------------------------------------ the model's side

    def gguf_file(self) -> GGUFFile | None:
        """The parsed header, or None when the thread could not read it (the loader then
        reads the file itself and reports why)."""
        self._header_read.wait()
        return self._gguf

    def take(self, kind: str, qtype: int, rows: int, cols: int, data: np.ndarray):
        """The prepared result of `kind` on these bytes (waiting while it is computed), or
        None: the caller computes it. The first call stops the prefetch after the result
        it is on: the model now runs its kernels on all threads, and a third busy thread
        would stall its OpenMP teams."""
        key = content_key(kind, qtype, rows, cols, data)
        with self._lock:
            self._stopped = True
            slot = self._slots.pop(key, None)
        if slot is None:
            return None
        slot.done.wait()
        self.used += slot.value is not None
        return slot.value

    def close(self) -> None:
        """Stops preparing, drops what was not taken and waits for the result the thread is
        on (a big one takes ~0.1 s): the engine's warm-up and first requests then run their
        OpenMP teams alone, not beside a third busy thread that would stall them."""
        with self._lock:
            self._stopped = True
            self._slots.clear()
        if self._thread.is_alive():
            t0 = time.monotonic()
            self._thread.join()
            self.seconds["stop"] = time.monotonic() - t0

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        t0 = time.monotonic()
        slot = None
        lower_thread_priority()  # the import of torch beside it is the critical path
        try:
            from tokenmill.model.gguf_file import GGUFFile

            self._gguf = gguf = GGUFFile(self.path)
            self._header_read.set()
            self.seconds["header"] = time.monotonic() - t0

            from tokenmill.kernels.build import load_kernels

            lib = load_kernels()  # built once per machine; loads torch's OpenMP runtime first
            if lib is None:
                return
            t1 = time.monotonic()
            for key, compute in self._plan(gguf, lib):  # planned lazily: first results early
                with self._lock:
                    if self._stopped:
                        break
                    if key in self._slots:  # the same bytes twice: one result is enough
                        continue
                    slot = self._slots[key] = _Slot()
                slot.value = compute()
                slot.done.set()
                self.prepared += 1
            self.seconds["native"] = time.monotonic() - t1
        except Exception:  # the model is then built as usual, which reports any real problem
            logger.debug("weight prefetch stopped", exc_info=True)
        finally:
            self._header_read.set()
            if slot is not None:
                slot.done.set()

    def _plan(
        self, gguf: GGUFFile, lib: ctypes.CDLL
    ) -> Iterator[tuple[tuple, Callable[[], np.ndarray]]]:
        """(content key, computation) in the order the model asks for them."""
        from tokenmill.model.model_files import gguf_arch

        arch = gguf_arch(gguf)
        tensors = {t.name: t for t in gguf.tensors}
        permuted = rope_permuted(gguf.metadata["general.architecture"])
        threads = 1  # one core beside the import: OpenMP teams would stall each other
        int_dot = self.int_dot and lib.tm_int_dot_kind() > 0
        budget = self.float_budget_bytes

        def packed(name: str, heads: int | None = None) -> _Packed | None:
            found = packed_rows(tensors[name]) if name in tensors else None
            if found is None:
                return None
            qtype, rows, cols, data = found
            if heads is not None and permuted:
                data = data[unpermuted_row_order(rows, heads)]
            return _Packed(qtype, rows, cols, data)

        def fused(parts: list[_Packed | None]) -> list[_Packed]:
            """As packed.cat_rows: one weight when the formats agree, else the parts."""
            got = [p for p in parts if p is not None]
            if len(got) == len(parts) and all(
                p.qtype == got[0].qtype and p.cols == got[0].cols for p in got
            ):
                data = np.concatenate([p.data for p in got])
                return [_Packed(got[0].qtype, sum(p.rows for p in got), got[0].cols, data)]
            return got

        def dequantized(kernel, w: _Packed, shape: tuple[int, int]) -> Callable[[], np.ndarray]:
            def run() -> np.ndarray:
                out = anonymous_array(shape, np.float32)
                kernel(w.data.ctypes.data, w.qtype, w.rows, w.cols, out.ctypes.data, threads)
                return out

            return run

        def linear(w: _Packed) -> Iterator[tuple[tuple, Callable[[], np.ndarray]]]:
            nonlocal budget
            if int_dot and lib.tm_int_dot_supported(w.qtype, w.rows, w.cols):

                def repack(w: _Packed = w) -> np.ndarray:
                    size = lib.tm_int_dot_repacked_bytes(w.qtype, w.rows, w.cols)
                    out = anonymous_array((size,), np.uint8)
                    lib.tm_int_dot_repack(
                        w.data.ctypes.data, w.qtype, w.rows, w.cols, out.ctypes.data
                    )
                    return out

                yield content_key(INT_DOT, w.qtype, w.rows, w.cols, w.data), repack
            if 4 * w.rows * w.cols <= budget:  # NativeMethod's dequant cache, in its order
                budget -= 4 * w.rows * w.cols

                float_t = dequantized(lib.tm_dequant_matrix_t, w, (w.cols, w.rows))
                yield content_key(FLOAT_T, w.qtype, w.rows, w.cols, w.data), float_t

        embed = packed("token_embd.weight")
        if embed is not None:
            table = dequantized(lib.tm_dequant_matrix, embed, (embed.rows, embed.cols))
            yield content_key(ROWS, embed.qtype, embed.rows, embed.cols, embed.data), table
        for i in range(arch.num_hidden_layers):
            blk = f"blk.{i}."
            layer = [
                fused(
                    [
                        packed(blk + "attn_q.weight", arch.num_attention_heads),
                        packed(blk + "attn_k.weight", arch.num_key_value_heads),
                        packed(blk + "attn_v.weight"),
                    ]
                ),
                fused([packed(blk + "attn_output.weight")]),
                fused([packed(blk + "ffn_gate.weight"), packed(blk + "ffn_up.weight")]),
                fused([packed(blk + "ffn_down.weight")]),
            ]
            for weights in layer:
                for w in weights:
                    yield from linear(w)
        lm_head = packed("output.weight")
        if lm_head is None or arch.tie_word_embeddings:
            lm_head = embed
        if lm_head is not None:
            yield from linear(lm_head)


def start_prefetch(config: EngineConfig) -> WeightPrefetch | None:
    """A running prefetch for this engine configuration, or None where it has nothing to
    prepare (HF folders, plans that convert weights at load, kernels turned off)."""
    from tokenmill.model.model_files import model_source

    mc = config.model_config
    plan = mc.plan
    if plan.scheme != "native" or plan.overrides:
        return None
    if envs.DISABLE_KERNELS.get():
        return None
    if not config.kernel_config.prefetch:  # to measure what it buys
        return None
    try:
        _, path, kind = model_source(mc.model)
    except (OSError, ValueError):  # the engine reports it
        return None
    if kind != "gguf":
        return None
    return WeightPrefetch(path, mc.dequant_cache_bytes, config.kernel_config.int_dot).start()
