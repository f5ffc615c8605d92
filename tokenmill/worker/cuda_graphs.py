"""CUDA graphs for decode and verification steps (single-row queries only): the forward is
captured once per batch size (1, 2, 4, 8, 16, 24, ... up to max_num_seqs) over static input
buffers, and a step of n rows replays the smallest size >= n with the rows past n padded:
no KV slot (-1: the KV write skips them) and an empty query (the attention returns at once).
Steps with multi-token chunks, or more rows than the largest size, run eagerly.

The same static-buffer forward runs without capture on any device (`capture=False`), which
is how CPU tests check the padding: its first n rows equal the eager forward's."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from tokenmill.kernels.triton.paged_attention import PagedAttentionMetadata
from tokenmill.model.attention import AttentionBackend, AttentionMetadata

logger = logging.getLogger(__name__)


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, then multiples of 8, up to the first that holds max_num_seqs rows."""
    sizes: list[int] = []
    for size in (1, 2, 4, *range(8, max_num_seqs + 8, 8)):
        sizes.append(size)
        if size >= max_num_seqs:
            break
    return sizes


def padded_size(num_rows: int, sizes: list[int]) -> int | None:
    return next((s for s in sizes if s >= num_rows), None)


@dataclass
class StaticInputs:
    """The device buffers a captured graph reads (sized for the largest batch)."""

    input_ids: torch.Tensor  # [B] int64
    positions: torch.Tensor  # [B] int64
    slot_mapping: torch.Tensor  # [B] int64, -1: padding
    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32
    block_table: torch.Tensor  # [B, max_blocks] int32

    @classmethod
    def allocate(cls, rows: int, max_blocks: int, device: torch.device) -> StaticInputs:
        def zeros(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        return cls(
            zeros(rows), zeros(rows), zeros(rows), zeros(rows + 1, dtype=torch.int32),
            zeros(rows, dtype=torch.int32), zeros(rows, max_blocks, dtype=torch.int32),
        )  # fmt: skip

    def fill(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        size: int,
    ) -> None:
        """Copies a decode step's n rows in and pads rows n..size: no slot, no query."""
        n = input_ids.shape[0]
        self.input_ids[:n].copy_(input_ids, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.slot_mapping[:n].copy_(meta.slot_mapping, non_blocking=True)
        self.slot_mapping[n:size].fill_(-1)
        self.seq_lens[:n].copy_(meta.decode_seq_lens, non_blocking=True)
        self.seq_lens[n:size].zero_()
        starts = torch.arange(size + 1, dtype=torch.int32).clamp_(max=n)
        self.query_start_loc[: size + 1].copy_(starts, non_blocking=True)
        width = meta.decode_block_table.shape[1]
        self.block_table[:n, :width].copy_(meta.decode_block_table, non_blocking=True)

    def metadata(self, size: int, max_model_len: int) -> AttentionMetadata:
        """Attention metadata over the first `size` rows of these buffers: the kernel's
        launch (its grid and key splits) is fixed for every step this size replays."""
        paged = PagedAttentionMetadata(
            self.query_start_loc[: size + 1], self.seq_lens[:size], self.block_table[:size], 1,
            max_model_len,
        )  # fmt: skip
        return AttentionMetadata(self.slot_mapping[:size], size, None, None, [], paged=paged)


class CUDAGraphRunner:
    def __init__(
        self,
        model,
        attn: AttentionBackend,
        kv_caches: list[torch.Tensor],
        max_num_seqs: int,
        max_model_len: int,
        capture: bool = True,
    ) -> None:
        self.model, self.attn, self.kv_caches = model, attn, kv_caches
        self.sizes = capture_sizes(max_num_seqs)
        self.max_model_len = max_model_len
        self.capture = capture
        device = model.method.device
        max_blocks = -(-max_model_len // attn.block_size)
        self.static = StaticInputs.allocate(self.sizes[-1], max_blocks, device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        if capture:
            self._capture_all()

    def supports(self, meta: AttentionMetadata, num_rows: int) -> bool:
        return not meta.chunks and padded_size(num_rows, self.sizes) is not None

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """The step's hidden states [n, hidden] (a view into the graph's output: use it
        before the next step)."""
        n = input_ids.shape[0]
        size = padded_size(n, self.sizes)
        self.static.fill(input_ids, positions, meta, size)
        if self.capture:
            self.graphs[size].replay()
            return self.outputs[size][:n]
        return self._run(size)[:n]

    def _run(self, size: int) -> torch.Tensor:
        s = self.static
        return self.model.forward(
            s.input_ids[:size], s.positions[:size], self.kv_caches, self.attn,
            s.metadata(size, self.max_model_len),
        )  # fmt: skip

    @torch.inference_mode()
    def _capture_all(self) -> None:
        t0 = time.monotonic()
        pool = torch.cuda.graph_pool_handle()
        self.static.slot_mapping.fill_(-1)  # capture writes no KV
        for size in reversed(self.sizes):  # largest first: the rest fit in its pool
            self._run(size)  # warm-up: Triton compiles, allocator settles
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self._run(size)
            self.graphs[size] = graph
        torch.cuda.synchronize()
        logger.info(
            "CUDA graphs captured for %d batch sizes (1 to %d) in %.1fs",
            len(self.sizes), self.sizes[-1], time.monotonic() - t0,
        )  # fmt: skip
