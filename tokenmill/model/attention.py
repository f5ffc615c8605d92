"""Attention over the paged KV cache: metadata built once per step, and the backend interface.

The flat batch holds single-token queries (decodes, in any phase) first, then multi-token
chunks (prefill chunks). Each layer's cache is one tensor [2, num_blocks, block_size * kv_heads
* head_dim]: K and V of one block are contiguous, so a block table gathers whole blocks.
"""

from __future__ import annotations

import copy
import math
import mmap
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from tokenmill.kernels import ops

if TYPE_CHECKING:
    from tokenmill.kernels.triton.paged_attention import PagedAttentionMetadata


def zeroed_pool(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    """A zero-filled tensor whose host pages are mapped on first touch: an anonymous mmap
    (the kernel's zero pages), so a 2 GiB KV pool costs nothing until it fills, where
    torch.zeros writes it all. Not numpy's zeros: numpy advises huge pages on large arrays,
    and where the kernel then compacts memory on every fault (THP defrag=madvise) a first
    touch costs ~25 us per 4 KiB page, 15x a plain fault: seconds per GiB of KV written."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(buf, dtype=dtype).view(shape)  # the tensor keeps `buf` alive


@dataclass
class ChunkAttention:
    """One multi-token query chunk of one sequence."""

    query_start: int  # row in the flat batch
    query_len: int
    context_len: int  # tokens of the sequence visible after this chunk (incl. the chunk)
    block_ids: torch.Tensor  # blocks covering context_len tokens
    _masks: dict | None = None  # sliding window -> mask, built when a backend first asks

    def mask_for(self, window: int | None) -> torch.Tensor | None:
        """The [query_len, context_len] bool mask of a layer with this sliding window (Gemma 3
        and GPT-OSS mix windows); None when plain causal. The native kernel needs none."""
        if self._masks is None:
            self._masks = {}
        if window not in self._masks:
            first = self.context_len - self.query_len
            mask = None
            if first > 0 or (window is not None and self.context_len > window):
                device = self.block_ids.device
                q_pos = torch.arange(first, self.context_len, device=device)[:, None]
                k_pos = torch.arange(self.context_len, device=device)[None, :]
                mask = k_pos <= q_pos
                if window is not None:
                    mask &= k_pos > q_pos - window
            self._masks[window] = mask
        return self._masks[window]


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] cache slot of each token
    num_decode_tokens: int
    decode_block_table: torch.Tensor | None  # [num_decodes, max_blocks] int64, padded with block 0
    decode_seq_lens: torch.Tensor | None  # [num_decodes] int64: visible keys incl. the new token
    chunks: list[ChunkAttention]
    _decode_masks: dict | None = None  # sliding window -> mask
    _chunk_tables: tuple | None = None  # chunk_tables(), built once
    # the Triton kernel's view of the step (attention_triton.paged_metadata), built once
    paged: PagedAttentionMetadata | None = None

    def chunk_tables(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The chunks as the native prefill kernel reads them, built once per step: block
        table [C, max_blocks] (padded with block 0), each chunk's first row in the flat batch
        then the end of the last [C + 1], and each one's context length [C]."""
        if self._chunk_tables is None:
            chunks = self.chunks
            width = max(len(c.block_ids) for c in chunks)
            table = torch.zeros(len(chunks), width, dtype=torch.int64)
            for i, c in enumerate(chunks):
                table[i, : len(c.block_ids)] = c.block_ids
            starts = [c.query_start for c in chunks] + [chunks[-1].query_start + chunks[-1].query_len]
            lens = [c.context_len for c in chunks]
            self._chunk_tables = (
                table,
                torch.tensor(starts, dtype=torch.int64),
                torch.tensor(lens, dtype=torch.int64),
            )
        return self._chunk_tables

    def decode_mask(self, block_size: int, sliding_window: int | None) -> torch.Tensor:
        """Additive mask [num_decodes, 1, 1, max_blocks * block_size], built once per step
        and window."""
        if self._decode_masks is None:
            self._decode_masks = {}
        if sliding_window not in self._decode_masks:
            assert self.decode_block_table is not None and self.decode_seq_lens is not None
            key_pos = torch.arange(self.decode_block_table.shape[1] * block_size)
            lens = self.decode_seq_lens[:, None]
            visible = key_pos[None, :] < lens
            if sliding_window is not None:
                visible &= key_pos[None, :] >= lens - sliding_window
            mask = torch.zeros(visible.shape, dtype=torch.float32)
            mask = mask.masked_fill_(~visible, float("-inf")).view(len(lens), 1, 1, -1)
            self._decode_masks[sliding_window] = mask
        return self._decode_masks[sliding_window]


class AttentionBackend(ABC):
    """Computes attention for one layer of a flat batch, reading and writing its KV cache."""

    name: str
    sinks: torch.Tensor | None = None  # per query head, a logit with no value (GPT-OSS)

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        sliding_window: int | None = None,
    ) -> None:
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_size = block_size
        self.sliding_window = sliding_window
        self.scale = head_dim**-0.5

    @classmethod
    def available(cls) -> bool:
        return True

    def for_layer(
        self, sliding_window: int | None, scale: float, sinks: torch.Tensor | None = None
    ) -> AttentionBackend:
        """This backend for a layer whose window, softmax scale or attention sinks differ
        from the model-wide ones it was made with (Gemma 3, GPT-OSS): a shallow copy."""
        if (sliding_window, scale, sinks) == (self.sliding_window, self.scale, None):
            return self
        layer = copy.copy(self)
        layer.sliding_window, layer.scale, layer.sinks = sliding_window, scale, sinks
        return layer

    def allocate_kv_cache(self, num_blocks: int, dtype: torch.dtype, device: str) -> torch.Tensor:
        block_numel = self.block_size * self.num_kv_heads * self.head_dim
        return zeroed_pool((2, num_blocks, block_numel), dtype, device)

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim]
        k: torch.Tensor,  # [T, num_kv_heads, head_dim]
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, num_heads * head_dim]
        ...


class TorchSDPABackend(AttentionBackend):
    """Portable backend: block gather + torch scaled_dot_product_attention."""

    name = "torch"

    def forward(self, q, k, v, kv_cache, meta):
        nkv, hd = self.num_kv_heads, self.head_dim
        kv_cache[0].view(-1, nkv, hd).index_copy_(0, meta.slot_mapping, k.to(kv_cache.dtype))
        kv_cache[1].view(-1, nkv, hd).index_copy_(0, meta.slot_mapping, v.to(kv_cache.dtype))

        out = torch.empty(q.shape[0], self.num_heads * hd, dtype=q.dtype, device=q.device)
        nd = meta.num_decode_tokens
        if nd:
            out[:nd] = self._decode(q[:nd], kv_cache, meta)
        if meta.chunks:
            self._chunks(q, k, v, kv_cache, meta, out)
        return out

    def _chunks(self, q, k, v, kv_cache, meta: AttentionMetadata, out: torch.Tensor) -> None:
        """Writes the multi-token chunks' rows of out."""
        for chunk in meta.chunks:
            s, n = chunk.query_start, chunk.query_len
            out[s : s + n] = self._chunk(q[s : s + n], k[s : s + n], v[s : s + n], kv_cache, chunk)

    def _decode(
        self, q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        nd, nkv, hd = q.shape[0], self.num_kv_heads, self.head_dim
        table = meta.decode_block_table
        length = table.shape[1] * self.block_size
        keys = kv_cache[0].index_select(0, table.view(-1)).view(nd, length, nkv, hd).to(q.dtype)
        values = kv_cache[1].index_select(0, table.view(-1)).view(nd, length, nkv, hd).to(q.dtype)
        # Query heads of one KV group become the "query length" axis: no K/V expansion.
        qg = q.reshape(nd, nkv, self.num_heads // nkv, hd)
        mask = meta.decode_mask(self.block_size, self.sliding_window)
        if self.sinks is not None:
            sinks = self.sinks.view(1, nkv, -1, 1)
            o = attention_with_sinks(qg, keys.transpose(1, 2), values.transpose(1, 2), mask,
                                     self.scale, sinks)  # fmt: skip
            return o.reshape(nd, self.num_heads * hd)
        o = F.scaled_dot_product_attention(
            qg, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=mask, scale=self.scale
        )
        return o.reshape(nd, self.num_heads * hd)

    def _chunk(self, q, k, v, kv_cache, chunk: ChunkAttention) -> torch.Tensor:
        nkv, hd = self.num_kv_heads, self.head_dim
        if chunk.context_len == chunk.query_len and kv_cache.dtype == k.dtype:
            keys, values = k, v  # nothing cached before: attend to itself (as stored)
        else:
            n = chunk.context_len
            keys = kv_cache[0].index_select(0, chunk.block_ids).view(-1, nkv, hd)[:n].to(q.dtype)
            values = kv_cache[1].index_select(0, chunk.block_ids).view(-1, nkv, hd)[:n].to(q.dtype)
        mask = chunk.mask_for(self.sliding_window)
        if self.sinks is not None:
            return self._chunk_with_sinks(q, keys, values, mask)
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0),
            keys.transpose(0, 1).unsqueeze(0),
            values.transpose(0, 1).unsqueeze(0),
            attn_mask=mask,
            is_causal=mask is None,
            scale=self.scale,
            enable_gqa=True,
        )
        return o[0].transpose(0, 1).reshape(chunk.query_len, self.num_heads * hd)

    def _chunk_with_sinks(self, q, keys, values, mask: torch.Tensor | None) -> torch.Tensor:
        n, nkv, hd = q.shape[0], self.num_kv_heads, self.head_dim
        if mask is None:
            mask = torch.ones(n, keys.shape[0], dtype=torch.bool).tril_()
        additive = torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))
        qg = q.view(n, nkv, -1, hd).permute(1, 2, 0, 3)  # [nkv, group, n, hd]
        o = attention_with_sinks(
            qg, keys.transpose(0, 1)[:, None], values.transpose(0, 1)[:, None], additive,
            self.scale, self.sinks.view(nkv, -1, 1, 1),
        )  # fmt: skip
        return o.permute(2, 0, 1, 3).reshape(n, self.num_heads * hd)


def attention_with_sinks(q, k, v, mask: torch.Tensor, scale: float, sinks: torch.Tensor):
    """softmax(q k^T * scale + mask) v with one more logit per head, `sinks`, in the
    denominator and no value (GPT-OSS). Shapes broadcast: q [..., Lq, hd], k/v [..., Lk, hd],
    sinks [..., 1 or Lq, 1]."""
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale).add_(mask)
    sink = sinks.float().expand(*scores.shape[:-1], 1)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    return torch.matmul(probs.to(v.dtype), v)


class CPUPagedBackend(TorchSDPABackend):
    """Decodes and prompt chunks read K/V straight from the paged cache in native kernels (no
    gather); layers with sinks (GPT-OSS) take torch's path."""

    name = "native"

    @classmethod
    def available(cls) -> bool:
        return ops.kernels_available()

    def _native(self, q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
        """The native kernels take float32 queries over a float32 or float16 pool, no sinks."""
        return (
            self.sinks is None and q.dtype == torch.float32
            and kv_cache.dtype in ops.KV_POOL_DTYPES
        )  # fmt: skip

    def _decode(
        self, q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        if not self._native(q, kv_cache):
            return super()._decode(q, kv_cache, meta)
        out = ops.paged_attention_decode(
            q.contiguous(),
            kv_cache,
            meta.decode_block_table,
            meta.decode_seq_lens,
            self.num_kv_heads,
            self.block_size,
            self.scale,
            self.sliding_window,
        )
        return out.view(q.shape[0], self.num_heads * self.head_dim)

    def _chunks(self, q, k, v, kv_cache, meta: AttentionMetadata, out: torch.Tensor) -> None:
        if not self._native(q, kv_cache):
            return super()._chunks(q, k, v, kv_cache, meta, out)
        block_table, query_start, context_lens = meta.chunk_tables()
        ops.paged_attention_prefill(
            q, kv_cache, block_table, query_start, context_lens, self.num_kv_heads,
            self.block_size, self.scale, self.sliding_window, out,
        )  # fmt: skip
