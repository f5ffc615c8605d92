"""The native prefill attention (tm_paged_attention_prefill): prompt chunks attend to their
sequence's keys in the paged cache. Checked against float64 SDPA on gathered keys in every
build, chunk by chunk against the whole prompt, and through the backend next to torch's."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tests.kernel_builds import KERNEL_BUILDS, kernel_build

BS = 16


@pytest.fixture(scope="module", params=KERNEL_BUILDS)
def prefill(request):
    """Each build's prefill attention: AVX-512 (where the CPU has it), AVX2, portable."""
    lib = kernel_build(request.param)

    def run(q, kv, table, starts, lens, nkv, scale, window, threads=2):
        t, nh, hd = q.shape
        out = torch.full((t, nh * hd), float("nan"))
        lib.tm_paged_attention_prefill(
            q.data_ptr(), q.stride(0), kv.data_ptr(), kv.shape[1], table.data_ptr(),
            table.shape[1], starts.data_ptr(), lens.data_ptr(), len(lens), nh, nkv, hd, BS,
            scale, window, out.data_ptr(), threads,
        )  # fmt: skip
        return out

    return run


def layout(chunks: list[tuple[int, int]], nh: int, nkv: int, hd: int, seed: int = 0):
    """A cache holding each chunk's sequence (cached tokens, then the chunk) in scattered
    blocks, query rows at a stride (a view of a wider qkv row) and the kernel's tables."""
    g = torch.Generator().manual_seed(seed)
    need = sum(-(-(n + cached) // BS) for n, cached in chunks)
    kv = torch.randn(2, need + 3, BS * nkv * hd, generator=g)
    kv[:, need:] = float("nan")  # blocks no chunk owns: must never be read
    perm = torch.randperm(need, generator=g)
    tables, starts, lens, used = [], [0], [], 0
    for n, cached in chunks:
        blocks = -(-(n + cached) // BS)
        tables.append(perm[used : used + blocks])
        used += blocks
        starts.append(starts[-1] + n)
        lens.append(n + cached)
    table = torch.zeros(len(chunks), max(len(t) for t in tables), dtype=torch.int64)
    for i, t in enumerate(tables):
        table[i, : len(t)] = t
    q = torch.randn(starts[-1], nh + 2 * nkv, hd, generator=g)[:, :nh]
    return q, kv, table, torch.tensor(starts), torch.tensor(lens)


def reference(q, kv, table, starts, lens, nkv, scale, window):
    t, nh, hd = q.shape
    keys, values = kv[0].view(-1, nkv, hd), kv[1].view(-1, nkv, hd)
    out = torch.empty(t, nh * hd)
    for c in range(len(lens)):
        s, e, n = int(starts[c]), int(starts[c + 1]), int(lens[c])
        pos = torch.arange(n)
        slots = table[c][pos // BS] * BS + pos % BS
        q_pos, k_pos = torch.arange(n - (e - s), n)[:, None], pos[None]
        mask = k_pos <= q_pos
        if window:
            mask &= k_pos > q_pos - window
        o = F.scaled_dot_product_attention(
            q[s:e].transpose(0, 1)[None].double(),
            keys[slots].transpose(0, 1)[None].double(),
            values[slots].transpose(0, 1)[None].double(),
            attn_mask=mask, scale=scale, enable_gqa=True,
        )  # fmt: skip
        out[s:e] = o[0].transpose(0, 1).reshape(e - s, nh * hd).float()
    return out


# (heads, KV heads, head size, window): GQA groups of 3 and 1, 16 (32 positions a task), 32
# and 64 (fewer positions a task), head sizes 64 / 128 / 96 / 256 and 40 (not a multiple of
# the lanes: the portable body), sliding windows shorter than a key tile and than a chunk
SHAPES = [
    (9, 3, 64, 0),
    (8, 8, 128, 0),
    (4, 2, 96, 0),
    (8, 2, 256, 37),
    (6, 1, 64, 5),
    (5, 5, 40, 0),
    (32, 2, 64, 0),
    (64, 2, 64, 20),
]
# (chunk length, tokens cached before it): a whole prompt, chunks after a cache hit, one
# row, a prompt past several query tiles
CHUNKS = [(37, 0), (5, 100), (64, 64), (1, 30), (130, 10)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_prefill_attention_matches_sdpa(prefill, shape):
    nh, nkv, hd, window = shape
    q, kv, table, starts, lens = layout(CHUNKS, nh, nkv, hd)
    scale = 1 / math.sqrt(hd)
    out = prefill(q, kv, table, starts, lens, nkv, scale, window)
    ref = reference(q, kv, table, starts, lens, nkv, scale, window)
    assert torch.allclose(out, ref, atol=1e-5, rtol=0), (out - ref).abs().max()


@pytest.mark.parametrize("shape", [(9, 3, 64, 0), (8, 2, 128, 50)], ids=str)
def test_a_row_is_the_same_whatever_chunk_it_comes_in(prefill, shape):
    """Key tiles sit at fixed positions, so the prompt prefilled whole, in chunks of 7 and 40
    (each after the cached tokens before it), or one row at a time gives every row the same
    bits, with one thread or two."""
    nh, nkv, hd, window = shape
    n = 150
    q, kv, table, _, _ = layout([(n, 0)], nh, nkv, hd, seed=3)
    scale = hd**-0.5
    whole = prefill(q, kv, table, torch.tensor([0, n]), torch.tensor([n]), nkv, scale, window)
    for step in (7, 40, 1):
        for threads in (1, 2):
            ends = list(range(step, n, step)) + [n]
            starts = torch.tensor([0, *ends])
            # each chunk is its own sequence entry reading the same blocks
            tables = table.expand(len(ends), -1).contiguous()
            parts = prefill(q, kv, tables, starts, torch.tensor(ends), nkv, scale, window, threads)
            assert torch.equal(parts, whole), (step, threads)


@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.float16], ids=str)
def test_backend_runs_decodes_and_chunks_as_torch_does(pool_dtype):
    """CPUPagedBackend.forward on a step with decode rows and prompt chunks (one after a cache
    hit) writes the cache (a float16 pool: rounded as torch rounds) and gives torch's
    backend's output."""
    from tokenmill.model.attention import (
        AttentionMetadata,
        ChunkAttention,
        CPUPagedBackend,
        TorchSDPABackend,
    )

    nh, nkv, hd = 9, 3, 64
    torch.manual_seed(0)
    kv = torch.randn(2, 40, BS * nkv * hd).to(pool_dtype)
    decode_table = torch.stack([torch.arange(0, 5), torch.arange(5, 10)])
    decode_lens = torch.tensor([70, 3])
    chunks, start = [], 2
    slots = [torch.tensor(4 * BS + 5), torch.tensor(5 * BS + 2)]  # the decodes' new tokens
    for first, n, blocks in ((0, 40, torch.arange(10, 13)), (50, 20, torch.arange(13, 18))):
        pos = torch.arange(first, first + n)
        slots.extend(blocks[pos // BS] * BS + pos % BS)
        chunks.append(ChunkAttention(start, n, first + n, blocks))
        start += n
    meta = AttentionMetadata(torch.stack(slots), 2, decode_table, decode_lens, chunks)
    q, k, v = torch.randn(start, nh, hd), torch.randn(start, nkv, hd), torch.randn(start, nkv, hd)
    native_kv, torch_kv = kv.clone(), kv.clone()
    native = CPUPagedBackend(nh, nkv, hd, BS, None).forward(q, k, v, native_kv, meta)
    ref = TorchSDPABackend(nh, nkv, hd, BS, None).forward(q, k, v, torch_kv, meta)
    assert torch.equal(native_kv, torch_kv)
    assert torch.allclose(native, ref, atol=1e-5), (native - ref).abs().max()
