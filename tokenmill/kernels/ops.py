"""Torch-facing wrappers of the C kernels. Callers check kernels_available() first."""

from __future__ import annotations

from typing import Any

import torch

from tokenmill.kernels.build import load_kernels


def kernels_available() -> bool:
    return load_kernels() is not None


def _p(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _threads() -> int:
    return torch.get_num_threads()


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    m, k = x.shape
    x = x.contiguous()
    out = torch.empty_like(x)
    load_kernels().tm_rmsnorm(_p(x), _p(weight), m, k, eps, _p(out), _threads())
    return out


def rmsnorm_quant(
    x: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = x.shape
    x = x.contiguous()
    q = torch.empty(m, k, dtype=torch.int8)
    scale = torch.empty(m, 1, dtype=torch.float32)
    load_kernels().tm_rmsnorm_quant(_p(x), _p(weight), m, k, eps, _p(q), _p(scale), _threads())
    return q, scale


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8; x may be a row-strided view (last dim contiguous)."""
    m, k = x.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    q = torch.empty(m, k, dtype=torch.int8)
    scale = torch.empty(m, 1, dtype=torch.float32)
    load_kernels().tm_quantize_rows_strided(_p(x), m, k, x.stride(0), _p(q), _p(scale), _threads())
    return q, scale


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up per row of [gate | up] with the one-call decoder's exp (poly_expf):
    its results bit for bit."""
    return _gated_mul(load_kernels().tm_silu_mul_rows, gate_up)


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gelu(gate, approximate="tanh") * up on [M, 2I] rows (gate first): the one-call
    decoder's GELU (decode_layers.c)."""
    return _gated_mul(load_kernels().tm_gelu_tanh_mul_rows, gate_up)


def _gated_mul(kernel, gate_up: torch.Tensor) -> torch.Tensor:
    """act(gate) * up on [M, 2I] rows through a tm_*_mul_rows kernel."""
    m, two_i = gate_up.shape
    gate_up = gate_up.contiguous()
    out = torch.empty(m, two_i // 2, dtype=torch.float32)
    kernel(_p(gate_up), m, two_i // 2, _p(out), _threads())
    return out


def silu_mul_quant(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    m, two_i = gate_up.shape
    gate_up = gate_up.contiguous()
    i = two_i // 2
    q = torch.empty(m, i, dtype=torch.int8)
    scale = torch.empty(m, 1, dtype=torch.float32)
    load_kernels().tm_silu_mul_quant(_p(gate_up), m, i, _p(q), _p(scale), _threads())
    return q, scale


def int8_linear(
    x_q: torch.Tensor,
    x_scale: torch.Tensor,
    weight: torch.Tensor,  # [N, K] int8, row-major
    weight_colsum: torch.Tensor,  # [N] int32
    weight_scale: torch.Tensor,  # [N] float32
    bias: torch.Tensor | None,
    out: torch.Tensor | None = None,  # given: accumulate into it (residual add)
) -> torch.Tensor:
    m, k = x_q.shape
    n = weight.shape[0]
    accumulate = out is not None
    if out is None:
        out = torch.empty(m, n, dtype=torch.float32)
    load_kernels().tm_int8_linear(
        _p(x_q), _p(x_scale), _p(weight), _p(weight_colsum), _p(weight_scale), _p(bias),
        m, n, k, _p(out), int(accumulate), _threads(),
    )  # fmt: skip
    return out


def dequant_i32(
    acc: torch.Tensor,
    x_scale: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    m, n = acc.shape
    accumulate = out is not None
    if out is None:
        out = torch.empty(m, n, dtype=torch.float32)
    load_kernels().tm_dequant_i32(
        _p(acc), _p(x_scale), _p(weight_scale), _p(bias), m, n, int(accumulate), _p(out), _threads()
    )
    return out


def rope_neox_(
    x: torch.Tensor, num_heads: int, head_dim: int, positions: torch.Tensor, cos, sin
) -> None:
    """In place on the first num_heads heads of each row of x ([T, row], row-contiguous), on
    each head's first 2 * cos.shape[1] dims (partial rotation: the rest as they are)."""
    t = x.shape[0]
    assert x.stride(1) == 1 and 2 * cos.shape[1] <= head_dim
    load_kernels().tm_rope_neox(
        _p(x), t, x.stride(0), num_heads, head_dim, 2 * cos.shape[1], _p(positions), _p(cos),
        _p(sin), _threads(),
    )  # fmt: skip


KV_POOL_DTYPES = (torch.float32, torch.float16)  # the paged attention kernels' KV pools


def _for_pool(lib: Any, name: str, kv_cache: torch.Tensor) -> Any:
    """The paged attention kernel `name` built for the pool's dtype (KV_POOL_DTYPES)."""
    if kv_cache.dtype not in KV_POOL_DTYPES:
        raise TypeError(f"{name}: no kernel for a {kv_cache.dtype} KV pool")
    return getattr(lib, name + ("_f16" if kv_cache.dtype == torch.float16 else ""))


def paged_attention_decode(
    q: torch.Tensor,  # [B, nh, hd] contiguous
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size * nkv * hd], float32 or float16
    block_table: torch.Tensor,  # [B, max_blocks] int64
    seq_lens: torch.Tensor,  # [B] int64
    num_kv_heads: int,
    block_size: int,
    scale: float,
    window: int | None,
) -> torch.Tensor:
    b, nh, hd = q.shape
    out = torch.empty_like(q)
    _for_pool(load_kernels(), "tm_paged_attention_decode", kv_cache)(
        _p(q), _p(kv_cache), kv_cache.shape[1], _p(block_table), _p(seq_lens),
        b, nh, num_kv_heads, hd, block_size, block_table.shape[1], scale, window or 0,
        _p(out), _threads(),
    )  # fmt: skip
    return out


def paged_attention_prefill(
    q: torch.Tensor,  # [T, nh, hd], rows at any stride, each row's heads contiguous
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size * nkv * hd], the chunks' keys written
    block_table: torch.Tensor,  # [C, max_blocks] int64
    query_start: torch.Tensor,  # [C + 1] int64: chunk c's rows are query_start[c] .. [c + 1] - 1
    context_lens: torch.Tensor,  # [C] int64: keys of chunk c's sequence after the chunk
    num_kv_heads: int,
    block_size: int,
    scale: float,
    window: int | None,
    out: torch.Tensor,  # [T, nh * hd] contiguous: the chunks' rows are written
) -> None:
    t, nh, hd = q.shape
    assert q.stride(2) == 1 and q.stride(1) == hd and out.is_contiguous()
    _for_pool(load_kernels(), "tm_paged_attention_prefill", kv_cache)(
        _p(q), q.stride(0), _p(kv_cache), kv_cache.shape[1], _p(block_table),
        block_table.shape[1], _p(query_start), _p(context_lens), context_lens.shape[0],
        nh, num_kv_heads, hd, block_size, scale, window or 0, _p(out), _threads(),
    )  # fmt: skip


def _packed_linear(kernel, x, data, weight, bias, out) -> torch.Tensor:
    """y = x W^T (+ bias) through a packed-weight GEMV kernel (tm_qlinear's signature);
    with `out` given, accumulates into it (residual add)."""
    m, k = x.shape
    accumulate = out is not None
    if out is None:
        out = torch.empty(m, weight.rows, dtype=torch.float32)
    kernel(
        _p(x), m, k, _p(data), weight.qtype, weight.rows, _p(bias), _p(out), int(accumulate),
        _threads(),
    )  # fmt: skip
    return out


def qlinear(
    x: torch.Tensor,  # [M, K] fp32, contiguous
    weight,  # PackedWeight [N, K]
    bias: torch.Tensor | None,
    out: torch.Tensor | None = None,  # given: accumulate into it (residual add)
) -> torch.Tensor:
    return _packed_linear(load_kernels().tm_qlinear, x, weight.data, weight, bias, out)


def dequant_matrix(weight, out: torch.Tensor) -> torch.Tensor:
    """A PackedWeight into `out` (fp32, at least rows * cols elements); returns the view."""
    view = out[: weight.rows * weight.cols].view(weight.rows, weight.cols)
    load_kernels().tm_dequant_matrix(
        _p(weight.data), weight.qtype, weight.rows, weight.cols, _p(view), _threads()
    )
    return view


def dequant_matrix_t(weight) -> torch.Tensor:
    """A PackedWeight transposed into a new fp32 [cols, rows] tensor (values as
    dequant_matrix's): the layout of a float GEMM's weight, with no transpose pass."""
    out = torch.empty(weight.cols, weight.rows, dtype=torch.float32)
    load_kernels().tm_dequant_matrix_t(
        _p(weight.data), weight.qtype, weight.rows, weight.cols, _p(out), _threads()
    )
    return out


def dequant_rows(weight, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` of a PackedWeight in fp32 (an embedding lookup)."""
    ids = ids.to(torch.int64).contiguous()
    out = torch.empty(ids.numel(), weight.cols, dtype=torch.float32)
    load_kernels().tm_dequant_rows(
        _p(weight.data), weight.qtype, weight.cols, _p(ids), ids.numel(), _p(out), _threads()
    )
    return out


def int_dot_kind() -> int:
    """The integer-dot kernels this build runs: 3 AVX-512 VNNI with the GEMM's tiles on AMX,
    2 AVX-512 VNNI, 1 AVX2, 0 plain C."""
    return load_kernels().tm_int_dot_kind()


def int_dot_amx_available() -> bool:
    """This build has the integer-dot GEMM's AMX tiles and the process may use them."""
    return bool(load_kernels().tm_int_dot_amx_available())


def set_int_dot_amx(on: bool) -> None:
    """The integer-dot GEMM runs its 8- and 16-bit tiles on AMX (where available) or on
    AVX-512 VNNI: the same bits either way."""
    load_kernels().tm_int_dot_set_amx(int(on))


def int_dot_supported(weight) -> bool:
    """Whether a PackedWeight can be repacked for the integer-dot GEMV (int_dot_linear)."""
    return bool(load_kernels().tm_int_dot_supported(weight.qtype, weight.rows, weight.cols))


def int_dot_repacked_bytes(qtype: int, rows: int, cols: int) -> int:
    """Bytes of int_dot_repack's output: the weight's own, Q4_K's a little more (a byte per
    sub-block scale and minimum)."""
    return load_kernels().tm_int_dot_repacked_bytes(qtype, rows, cols)


def int_dot_repack(weight) -> torch.Tensor:
    """A PackedWeight's blocks regrouped for int_dot_linear (int_dot_repacked_bytes)."""
    out = torch.empty(int_dot_repacked_bytes(weight.qtype, weight.rows, weight.cols), dtype=torch.uint8)
    load_kernels().tm_int_dot_repack(
        _p(weight.data.contiguous()), weight.qtype, weight.rows, weight.cols, _p(out)
    )
    return out


def int_dot_linear(
    x: torch.Tensor,  # [M, K] fp32, contiguous
    repacked: torch.Tensor,  # int_dot_repack(weight)
    weight,  # the PackedWeight it came from (format and shape)
    bias: torch.Tensor | None,
    out: torch.Tensor | None = None,  # given: accumulate into it (residual add)
    bits: int = 24,
) -> torch.Tensor:
    """The integer-dot GEMV (decode rows, 8 per pass over the weights) with activations
    rounded to `bits` (24, 16 or 8): a row's result is int_dot_gemm's at the same bits."""
    return _int_dot(load_kernels().tm_int_dot_linear, x, repacked, weight, bias, out, bits)


def int_dot_gemm(
    x: torch.Tensor,  # [M, K] fp32, contiguous
    repacked: torch.Tensor,  # int_dot_repack(weight)
    weight,  # the PackedWeight it came from (format and shape)
    bias: torch.Tensor | None,
    out: torch.Tensor | None = None,  # given: accumulate into it (residual add)
    bits: int = 24,
) -> torch.Tensor:
    """The integer-dot GEMM (many rows: prefill, batched steps) on the same repacked weights,
    with activations rounded to `bits` (int_dot_linear's results at the same bits, bit for
    bit; 16: two thirds of 24's dot products, 8: one int8 per value and block, a third)."""
    return _int_dot(load_kernels().tm_int_dot_gemm, x, repacked, weight, bias, out, bits)


def _int_dot(kernel, x, repacked, weight, bias, out, bits: int) -> torch.Tensor:
    m, k = x.shape
    accumulate = out is not None
    if out is None:
        out = torch.empty(m, weight.rows, dtype=torch.float32)
    kernel(
        _p(x), m, k, _p(repacked), weight.qtype, weight.rows, _p(bias), _p(out), int(accumulate),
        bits, _threads(),
    )  # fmt: skip
    return out


def int_dot_bound_table(repacked: torch.Tensor, weight) -> torch.Tensor:
    """What bounds int_dot_argmax's estimates, per 16-row group and block (see
    tm_int_dot_bound_table): N / 16 * (K / 32 + 1) floats."""
    out = torch.empty(weight.rows // 16 * (weight.cols // 32 + 1), dtype=torch.float32)
    load_kernels().tm_int_dot_bound_table(
        _p(repacked), weight.qtype, weight.rows, weight.cols, _p(out)
    )
    return out


def int_dot_argmax(
    x: torch.Tensor,  # [M, K] fp32, contiguous
    repacked: torch.Tensor,  # int_dot_repack(weight)
    weight,  # the PackedWeight it came from
    bounds: torch.Tensor,  # int_dot_bound_table(repacked, weight)
    bits: int = 24,
) -> torch.Tensor:
    """Per row of x, the index of the largest output of int_dot_linear at `bits` (bit-exact,
    first on ties), from a high-byte estimate and exact outputs only where they could win; -1
    where a row's outputs are not finite (compute it in full)."""
    m, k = x.shape
    out = torch.empty(m, dtype=torch.int64)
    load_kernels().tm_int_dot_argmax(
        _p(x), m, k, _p(repacked), weight.qtype, weight.rows, _p(bounds), _p(out), bits,
        _threads(),
    )  # fmt: skip
    return out


LORA_TILE = 32  # lora_kernels.c's TILE


def lora_b_tiles(b: torch.Tensor) -> torch.Tensor:
    """One module's B [w, out] as lora_sgmv reads it: tiles of LORA_TILE columns, each
    [w, LORA_TILE] contiguous, the last zero-padded; flat, fp16."""
    w, out = b.shape
    padded = torch.zeros(w, -(-out // LORA_TILE) * LORA_TILE, dtype=torch.float16)
    padded[:, :out] = b
    return padded.view(w, padded.shape[1] // LORA_TILE, LORA_TILE).transpose(0, 1).reshape(-1)


def lora_sgmv(
    x: torch.Tensor,
    y: torch.Tensor,
    seg_start: torch.Tensor,
    rows: torch.Tensor,
    a_ptrs: int,
    b_ptrs: int,
    widths: torch.Tensor,
    outs: torch.Tensor,
) -> None:
    """y[rows of segment s] += (x[those rows] · A_sᵀ) · B_s for every segment (an adapter's
    rows), in place; A_s [R_s, in] and B_s (lora_b_tiles per module, back to back) fp16, addressed by the pointer
    arrays at a_ptrs / b_ptrs; seg_start, rows, widths, outs int32."""
    load_kernels().tm_lora_sgmv(
        _p(x), x.stride(0), _p(y), y.stride(0), x.shape[1], seg_start.shape[0] - 1,
        _p(seg_start), _p(rows), a_ptrs, b_ptrs, outs.shape[0], _p(widths), _p(outs), _threads(),
    )  # fmt: skip
