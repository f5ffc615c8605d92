"""The Triton KV write and paged attention against a float64 torch reference, on every shape
class a step produces: prefill, a chunk over a cached prefix, decodes, the 1+k rows of a
verification, GQA groups, sliding windows, long contexts split over the keys, padded rows."""

from __future__ import annotations

import pytest
import torch

from tests.triton.conftest import DEVICE, DTYPES
from tokenmill.kernels.triton.kv_write import write_kv
from tokenmill.kernels.triton.paged_attention import (
    PagedAttentionMetadata,
    num_kv_splits,
    paged_attention,
)

TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _build(seqs, heads, kv_heads, head_dim, page, dtype, seed=0, kv_dtype=None):
    """seqs: (cached tokens, new query rows) per sequence. Returns q, k/v of the new rows, the
    caches (in kv_dtype, default dtype) holding the cached keys, metadata, slot mapping and
    full per-sequence K/V as the caches hold them."""
    g = torch.Generator().manual_seed(seed)
    blocks_per = [-(-(c + n) // page) for c, n in seqs]
    num_blocks = sum(blocks_per) + 3
    perm = torch.randperm(num_blocks, generator=g)[: sum(blocks_per)]  # scattered pages
    kv_dtype = kv_dtype or dtype
    k_cache = torch.randn(num_blocks, page, kv_heads, head_dim, generator=g).to(kv_dtype)
    v_cache = torch.randn(num_blocks, page, kv_heads, head_dim, generator=g).to(kv_dtype)
    tables, full_k, full_v, slots, qs, ks, vs = [], [], [], [], [], [], []
    at = 0
    for (cached, n), nb in zip(seqs, blocks_per, strict=True):
        table = perm[at : at + nb]
        at += nb
        tables.append(table)
        pos = torch.arange(cached + n)
        slot = table[pos // page] * page + pos % page
        kk = torch.randn(cached + n, kv_heads, head_dim, generator=g).to(dtype)
        vv = torch.randn(cached + n, kv_heads, head_dim, generator=g).to(dtype)
        k_cache.view(-1, kv_heads, head_dim)[slot[:cached]] = kk[:cached].to(kv_dtype)
        v_cache.view(-1, kv_heads, head_dim)[slot[:cached]] = vv[:cached].to(kv_dtype)
        full_k.append(kk.to(kv_dtype))
        full_v.append(vv.to(kv_dtype))
        slots.append(slot[cached:])
        ks.append(kk[cached:])
        vs.append(vv[cached:])
        qs.append(torch.randn(n, heads, head_dim, generator=g).to(dtype))
    max_blocks = max(blocks_per)
    table = torch.zeros(len(seqs), max_blocks, dtype=torch.int32)
    for i, t in enumerate(tables):
        table[i, : len(t)] = t
    lens = [n for _, n in seqs]
    starts = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    meta = PagedAttentionMetadata(
        query_start_loc=starts,
        seq_lens=torch.tensor([c + n for c, n in seqs], dtype=torch.int32),
        block_table=table,
        max_query_len=max(lens),
        max_seq_len=max(c + n for c, n in seqs),
    )
    return (
        torch.cat(qs), torch.cat(ks), torch.cat(vs), k_cache, v_cache, meta,
        torch.cat(slots), full_k, full_v,
    )  # fmt: skip


def _reference(q, seqs, full_k, full_v, scale, window, sinks=None):
    out = []
    row = 0
    group = q.shape[1] // full_k[0].shape[1]
    for (cached, n), kk, vv in zip(seqs, full_k, full_v, strict=True):
        qq = q[row : row + n].double()
        row += n
        k = kk.double().repeat_interleave(group, dim=1)
        v = vv.double().repeat_interleave(group, dim=1)
        s = torch.einsum("qhd,khd->hqk", qq, k) * scale
        qpos = torch.arange(cached, cached + n)[:, None]
        kpos = torch.arange(cached + n)[None, :]
        visible = kpos <= qpos
        if window:
            visible &= kpos > qpos - window
        s = s.masked_fill(~visible, float("-inf"))
        if sinks is not None:  # one more logit per head, with no value
            sink = sinks.double().view(-1, 1, 1).expand(-1, n, 1)
            p = torch.cat([s, sink], dim=-1).softmax(-1)[..., :-1]
        else:
            p = s.softmax(-1)
        out.append(torch.einsum("hqk,khd->qhd", p, v))
    return torch.cat(out)


def _to(device, *tensors):
    return [t.to(device) for t in tensors]


def _run(seqs, heads, kv_heads, head_dim, page, dtype, window=None, splits=1, seed=0, sinks=None,
         scale=None, kv_dtype=None):  # fmt: skip
    q, k, v, kc, vc, meta, slots, fk, fv = _build(
        seqs, heads, kv_heads, head_dim, page, dtype, seed, kv_dtype
    )
    q, k, v, kc, vc, slots = _to(DEVICE, q, k, v, kc, vc, slots)
    meta = PagedAttentionMetadata(
        *_to(DEVICE, meta.query_start_loc, meta.seq_lens, meta.block_table),
        meta.max_query_len,
        meta.max_seq_len,
    )
    write_kv(k, v, kc, vc, slots)
    scale = head_dim**-0.5 if scale is None else scale
    dev_sinks = None if sinks is None else sinks.to(DEVICE)
    out = paged_attention(q, kc, vc, meta, scale, window, splits, sinks=dev_sinks)
    ref = _reference(q.cpu(), seqs, fk, fv, scale, window, sinks)
    err = (out.cpu().double() - ref).abs().max().item()
    assert err < TOL[dtype], err
    return kc, vc, fk, slots


CASES = {
    "prefill": [(0, 37)],
    "prefill_batch": [(0, 5), (0, 70), (0, 1)],
    "chunk_over_cached_prefix": [(45, 19), (130, 64)],
    "decodes": [(10, 1), (63, 1), (64, 1), (200, 1)],
    "verification_rows": [(20, 4), (77, 1), (31, 6)],
    "mixed_step": [(50, 1), (9, 1), (16, 33), (0, 12)],
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_paged_attention_matches_the_reference(case, dtype):
    _run(CASES[case], heads=8, kv_heads=2, head_dim=32, page=16, dtype=dtype)


@pytest.mark.parametrize("case", ["mixed_step", "chunk_over_cached_prefix"])
def test_a_float16_pool_under_float32_queries(case):
    """--kv-cache-dtype float16 under float32 weights: the write rounds K/V to the pool's
    dtype, attention reads them back in the queries' (reference: the rounded K/V)."""
    _run(CASES[case], 8, 2, 32, 16, torch.float32, kv_dtype=torch.float16)
    _run([(700, 1), (33, 1)], 8, 2, 32, 16, torch.float32, splits=3, kv_dtype=torch.float16)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "page"),
    [(4, 4, 16, 16), (6, 2, 24, 8), (12, 1, 64, 32), (16, 8, 128, 16)],
    ids=["mha", "group3_odd_dim", "mqa_group12", "group2_dim128"],
)
def test_head_layouts_and_page_sizes(heads, kv_heads, head_dim, page):
    _run([(21, 3), (0, 18), (40, 1)], heads, kv_heads, head_dim, page, torch.float32)


@pytest.mark.parametrize("window", [1, 7, 40])
def test_sliding_window(window):
    _run([(60, 1), (33, 20), (0, 50), (90, 3)], 4, 2, 16, 16, torch.float32, window=window)


@pytest.mark.parametrize("splits", [2, 3, 5])
def test_long_decodes_split_over_the_keys_combine_exactly(splits):
    seqs = [(700, 1), (130, 1), (5, 1), (1100, 1)]
    _run(seqs, 8, 2, 32, 16, torch.float32, splits=splits)
    _run(seqs, 8, 2, 32, 16, torch.float32, window=300, splits=splits)


@pytest.mark.parametrize("splits", [1, 3])
def test_attention_sinks(splits):
    """GPT-OSS: a learned logit per head joins each softmax (with no value), once."""
    sinks = torch.linspace(-2.0, 3.0, 8)
    _run([(40, 1), (0, 21), (70, 4)], 8, 2, 32, 16, torch.float32, splits=splits, sinks=sinks)
    _run([(40, 1), (300, 1)], 8, 2, 32, 16, torch.float32, window=64, splits=splits, sinks=sinks)


@pytest.mark.parametrize("splits", [1, 2])
def test_family_layer_parameters(splits):
    """Gemma 3's softmax scale from query_pre_attn_scalar (not head_dim) on its sliding and
    global layers, and GPT-OSS's sinks on windowed and full layers: per-layer launch
    parameters of the one kernel."""
    seqs = [(30, 1), (0, 19), (12, 9)] if splits == 1 else [(90, 1), (600, 1)]
    for window in (6, None):
        _run(seqs, 4, 2, 16, 8, torch.float32, window=window, splits=splits, scale=24**-0.5)
        sinks = torch.tensor([0.3, -1.0, 2.0, 0.0])
        _run(seqs, 4, 2, 16, 8, torch.float32, window=window, splits=splits, sinks=sinks)


def test_split_count_fills_the_device_only_for_long_single_row_queries():
    def meta(q_lens, seq_len):
        starts = torch.tensor([0, *q_lens]).cumsum(0)
        return PagedAttentionMetadata(starts, torch.zeros(0), torch.zeros(0), max(q_lens), seq_len)

    assert num_kv_splits(meta([1] * 4, 8192), 8, num_sms=132) == 9  # 32 programs -> 264
    assert num_kv_splits(meta([1] * 4, 600), 8, num_sms=132) == 2  # by the keys
    assert num_kv_splits(meta([1] * 256, 8192), 8, num_sms=132) == 1  # device full
    assert num_kv_splits(meta([1, 5], 8192), 8, num_sms=132) == 1  # a multi-row query


def test_kv_write_skips_padded_rows_and_writes_every_other_slot():
    heads, hd, page = 2, 16, 8
    kc = torch.zeros(4, page, heads, hd, device=DEVICE)
    vc = torch.zeros_like(kc)
    k = torch.randn(5, heads, hd, device=DEVICE)
    v = torch.randn(5, heads, hd, device=DEVICE)
    slots = torch.tensor([3, -1, 17, 31, -1], device=DEVICE)
    write_kv(k, v, kc, vc, slots)
    flat_k, flat_v = kc.view(-1, heads, hd), vc.view(-1, heads, hd)
    for row, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(flat_k[slot], k[row]) and torch.equal(flat_v[slot], v[row])
    written = flat_k.abs().sum(dim=(1, 2)) > 0
    assert written.nonzero().flatten().tolist() == [3, 17, 31]


def test_padded_sequences_of_a_captured_batch_write_nothing():
    """A CUDA-graph batch padded with empty sequences (query length 0): their output rows do
    not exist and real rows are unaffected."""
    q, k, v, kc, vc, meta, slots, fk, fv = _build([(30, 1), (12, 1)], 4, 2, 16, 16, torch.float32)
    q, k, v, kc, vc, slots = _to(DEVICE, q, k, v, kc, vc, slots)
    write_kv(k, v, kc, vc, slots)
    starts = torch.tensor([0, 1, 2, 2, 2], dtype=torch.int32, device=DEVICE)  # 2 padded seqs
    lens = torch.tensor([31, 13, 0, 0], dtype=torch.int32, device=DEVICE)
    table = torch.cat([meta.block_table, torch.zeros_like(meta.block_table)]).to(DEVICE)
    padded = PagedAttentionMetadata(starts, lens, table, 1, 31)
    out = paged_attention(q, kc, vc, padded, 16**-0.5)
    ref = _reference(q.cpu(), [(30, 1), (12, 1)], fk, fv, 16**-0.5, None)
    assert (out.cpu().double() - ref).abs().max() < 2e-5
