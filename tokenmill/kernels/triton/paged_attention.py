"""One paged attention kernel for every step: variable-length queries over a cached prefix
(prefill chunks, decodes, the 1+k rows of a speculative verification), GQA, causal, sliding
window, and split-KV for long decode contexts.

A program takes BLOCK_Q query rows of one sequence times the query heads of one KV head
(BLOCK_M = BLOCK_Q * GROUP_P2 rows of a tile, so K and V are read once per KV group), walks
the keys it may see in tiles of BLOCK_N (each key's page found through the block table) and
keeps an online softmax in fp32. With splits > 1 each program covers a share of the key tiles
and writes a partial output and its log-sum-exp; a second kernel combines them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass
class PagedAttentionMetadata:
    """The step's sequences as the kernel reads them (tensors on the compute device)."""

    query_start_loc: torch.Tensor  # [S + 1] int32: first query row of each sequence
    seq_lens: torch.Tensor  # [S] int32: keys visible to the last query (cached + new)
    block_table: torch.Tensor  # [S, max_blocks] int32
    max_query_len: int
    max_seq_len: int


@triton.jit
def _attend_key_tiles(
    q, q_pos, k_cache_ptr, v_cache_ptr, table_ptr, kv_base, stride_cb, stride_cs,
    tile_begin, tile_end, hi, scale, window, d, d_ok, m_i, l_i,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """Online softmax over key tiles [tile_begin, tile_end) from the running (row max,
    row sum) given: (row max, row sum, output)."""
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for tile in range(tile_begin, tile_end):
        n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < hi
        page = tl.load(table_ptr + n // PAGE, mask=n_ok, other=0)
        key_off = page.to(tl.int64) * stride_cb + (n % PAGE) * stride_cs + kv_base
        k = tl.load(
            k_cache_ptr + key_off[None, :] + d[:, None],
            mask=n_ok[None, :] & d_ok[:, None],
            other=0.0,
        ).to(q.dtype)  # a pool of another dtype (--kv-cache-dtype) computes in q's
        s = tl.dot(q, k, input_precision=DOT_PRECISION) * scale
        visible = (n[None, :] <= q_pos[:, None]) & n_ok[None, :]
        if window > 0:
            visible = visible & (n[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_cache_ptr + key_off[:, None] + d[None, :],
            mask=n_ok[:, None] & d_ok[None, :],
            other=0.0,
        ).to(q.dtype)
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _paged_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    lse_ptr,
    sinks_ptr,
    block_table_ptr,
    query_start_ptr,
    seq_len_ptr,
    scale,
    window,
    num_splits,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_os,
    stride_lt,
    stride_lh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_bt,
    GROUP: tl.constexpr,
    GROUP_P2: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    SPLIT: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    q_tile = tl.program_id(1)
    kv_head = tl.program_id(2) // num_splits
    split = tl.program_id(2) % num_splits

    q_start = tl.load(query_start_ptr + seq)
    q_len = tl.load(query_start_ptr + seq + 1) - q_start
    if q_tile * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_len_ptr + seq)
    context = seq_len - q_len  # keys cached before this step's first query

    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_P2
    rows = tl.arange(0, BLOCK_M)
    qi = q_tile * BLOCK_Q + rows // GROUP_P2
    g = rows % GROUP_P2
    head = kv_head * GROUP + g
    row_ok = (qi < q_len) & (g < GROUP)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q_rows = (q_start + qi).to(tl.int64)
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    q_pos = context + qi

    # keys this tile may see: [lo, hi)
    hi = tl.minimum(context + (q_tile + 1) * BLOCK_Q, seq_len)
    lo = hi * 0
    if window > 0:
        lo = tl.maximum(context + q_tile * BLOCK_Q - window + 1, 0)
    first_tile = lo // BLOCK_N
    num_tiles = tl.cdiv(hi, BLOCK_N) - first_tile
    per_split = tl.cdiv(num_tiles, num_splits)
    tile_begin = first_tile + split * per_split
    tile_end = tl.minimum(tile_begin + per_split, first_tile + num_tiles)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    if HAS_SINKS:  # a logit per head with no value (GPT-OSS), counted once: in split 0
        sink = tl.load(sinks_ptr + head, mask=row_ok & (split == 0), other=float("-inf"))
        m_i = sink.to(tl.float32)
        l_i = tl.where(m_i > float("-inf"), 1.0, 0.0)
    m_i, l_i, acc = _attend_key_tiles(
        q, q_pos, k_cache_ptr, v_cache_ptr, block_table_ptr + seq * stride_bt,
        kv_head * stride_ch, stride_cb, stride_cs, tile_begin, tile_end, hi, scale, window,
        d, d_ok, m_i, l_i, BLOCK_M, BLOCK_N, BLOCK_D, PAGE, DOT_PRECISION,
    )  # fmt: skip
    has_keys = l_i > 0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    out_off = q_rows[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
    store_ok = row_ok[:, None] & d_ok[None, :]
    if SPLIT:
        tl.store(out_ptr + out_off + split * stride_os, out, mask=store_ok)
        lse = tl.where(has_keys, m_i + tl.log(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        lse_off = q_rows * stride_lt + head * stride_lh + split
        tl.store(lse_ptr + lse_off, lse, mask=row_ok)
    else:
        tl.store(out_ptr + out_off, out.to(out_ptr.dtype.element_ty), mask=store_ok)


@triton.jit
def _combine_splits_kernel(
    part_ptr,
    lse_ptr,
    out_ptr,
    num_splits,
    stride_pt,
    stride_ph,
    stride_ps,
    stride_lt,
    stride_lh,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SPLITS_P2: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, SPLITS_P2)
    s_ok = s < num_splits
    lse = tl.load(lse_ptr + t * stride_lt + h * stride_lh + s, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.where(s_ok, tl.exp(lse - m), 0.0)
    total = tl.sum(w, 0)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    part = tl.load(
        part_ptr + t * stride_pt + h * stride_ph + s[:, None] * stride_ps + d[None, :],
        mask=s_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    out = tl.sum(part * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(
        out_ptr + t * stride_ot + h * stride_oh + d,
        out.to(out_ptr.dtype.element_ty),
        mask=d_ok,
    )


# Query-tile rows (BLOCK_Q * heads per KV head) when some query spans many rows, and keys
# per inner step; decode-only steps use the smallest tile tl.dot takes (16 rows).
_PREFILL_TILE_ROWS = 64
_DECODE_TILE_ROWS = 16
_BLOCK_N = 64
_MAX_SPLITS = 16
_KEYS_PER_SPLIT = 512


def num_kv_splits(meta: PagedAttentionMetadata, num_kv_heads: int, num_sms: int) -> int:
    """Splits over the keys for steps whose queries fit one tile (decodes, verification):
    enough programs to fill the device, at least _KEYS_PER_SPLIT keys each."""
    num_seqs = meta.query_start_loc.shape[0] - 1
    if meta.max_query_len > 1 or num_seqs == 0:
        return 1
    programs = num_seqs * num_kv_heads
    by_device = -(-2 * num_sms // programs)
    by_keys = -(-meta.max_seq_len // _KEYS_PER_SPLIT)
    return max(1, min(by_device, by_keys, _MAX_SPLITS))


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: PagedAttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
    num_splits: int = 1,
    out: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: [T, heads, head_dim]; caches: [blocks, page, kv_heads, head_dim] holding every
    query's own K/V already (write_kv first); sinks: [heads] fp32 logits with no value, or
    None. Returns [T, heads, head_dim] in q's dtype."""
    t, heads, head_dim = q.shape
    kv_heads, page = k_cache.shape[2], k_cache.shape[1]
    group = heads // kv_heads
    group_p2 = triton.next_power_of_2(group)
    tile_rows = _PREFILL_TILE_ROWS if meta.max_query_len > 1 else _DECODE_TILE_ROWS
    block_q = max(1, tile_rows // group_p2)
    num_seqs = meta.query_start_loc.shape[0] - 1
    q_tiles = max(1, -(-meta.max_query_len // block_q))
    if out is None:
        out = torch.empty_like(q)
    if t == 0 or num_seqs == 0:
        return out
    assert k_cache.stride() == v_cache.stride() and q.stride(-1) == 1
    split = num_splits > 1
    if split:
        part = torch.empty(t, heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        lse = torch.empty(t, heads, num_splits, dtype=torch.float32, device=q.device)
        target, strides = part, (part.stride(0), part.stride(1), part.stride(2))
    else:
        lse = torch.empty(0, dtype=torch.float32, device=q.device)
        target, strides = out, (out.stride(0), out.stride(1), 0)
    _paged_attention_kernel[(num_seqs, q_tiles, kv_heads * num_splits)](
        q,
        k_cache,
        v_cache,
        target,
        lse,
        lse if sinks is None else sinks,
        meta.block_table,
        meta.query_start_loc,
        meta.seq_lens,
        scale,
        sliding_window or 0,
        num_splits,
        q.stride(0),
        q.stride(1),
        *strides,
        lse.stride(0) if split else 0,
        lse.stride(1) if split else 0,
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        meta.block_table.stride(0),
        GROUP=group,
        GROUP_P2=group_p2,
        BLOCK_Q=block_q,
        BLOCK_N=_BLOCK_N,
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        PAGE=page,
        SPLIT=split,
        HAS_SINKS=sinks is not None,
        # fp32 inputs: exact products (as the CPU interpreter and torch compute them)
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    if split:
        _combine_splits_kernel[(t, heads)](
            part,
            lse,
            out,
            num_splits,
            part.stride(0),
            part.stride(1),
            part.stride(2),
            lse.stride(0),
            lse.stride(1),
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            BLOCK_D=triton.next_power_of_2(head_dim),
            SPLITS_P2=triton.next_power_of_2(num_splits),
        )
    return out
