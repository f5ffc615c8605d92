"""How linear layers run: the float method (fp32 GEMM), the bfloat16 method (bf16 weights
and GEMM inputs, fp32 accumulation and everything else), the int8 method (W8A8) or the
native method (GGUF Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q6_K weights used as the
file stores them, fp32 activations and accumulation).

A method owns the linear layers and the activation steps that feed them (RMSNorm, SiLU*up,
quantization), so the int8 method can fuse "normalize then quantize" into one pass. Every
step treats rows independently, so a sequence's numbers never depend on the rest of the
batch: both methods are batch-invariant.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from tokenmill.config import KernelConfig
from tokenmill.kernels import ops
from tokenmill.model.packed import Int8Weight, OutlierSplit, PackedStack, PackedWeight, as_float
from tokenmill.model.prefetch import FLOAT_T, INT_DOT, ROWS, WeightPrefetch
from tokenmill.model.row_kernels import UNLIMITED, amx_tiles, int_dot_row_limit

logger = logging.getLogger(__name__)

# Below this many rows the native int8 kernel beats torch._int_mm (oneDNN).
_NATIVE_INT8_MAX_ROWS = 16

QuantizedActivation = tuple[torch.Tensor, torch.Tensor]  # (int8 [M, K], scale [M, 1])


class FloatLinear:
    """y = x @ W^T (+ b) (+ residual), W kept transposed ([in, out]): faster than F.linear
    for the skinny batches of decoding."""

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, transposed: bool = False
    ) -> None:
        """`transposed`: `weight` is W^T already laid out [in, out] (contiguous float32)."""
        self.weight_t = weight if transposed else weight.float().t().contiguous()
        self.bias = bias.float().contiguous() if bias is not None else None

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if self.bias is not None:
            y = torch.addmm(self.bias, x, self.weight_t)
            return y if residual is None else residual.add_(y)
        if residual is not None:
            return torch.addmm(residual, x, self.weight_t)
        return x @ self.weight_t


# Batch size oneDNN packs bf16 weights for; any batch size runs on the packed weight.
_BF16_PACK_BATCH_HINT = 32


def packed_bf16_available() -> bool:
    """oneDNN can pack bf16 weights and run bf16 GEMMs natively (AVX512-BF16 / AMX)."""
    try:
        return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    except (AttributeError, RuntimeError):
        return False


class BFloat16Linear:
    """bf16 weights and inputs, fp32 accumulation, fp32 out; bias and residual added in fp32.

    Where oneDNN runs bf16 natively the weight is packed once into its blocked layout (as
    torch's inductor freezing does), which spares the per-call reorder: on an AMX CPU this is
    ~4x the fp32 GEMM throughput at batch 32 and faster than fp32 at batch 1. Elsewhere it
    is a plain bf16 matmul. Not batch-invariant: oneDNN picks kernels by batch size."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, packed: bool) -> None:
        w = weight.float().to(torch.bfloat16).contiguous()  # [out, in]
        self.packed = packed
        if packed:
            self.weight = torch.ops.mkldnn._reorder_linear_weight(w, _BF16_PACK_BATCH_HINT)
        else:
            self.weight = w.t().contiguous()  # [in, out]
        self.bias = bias.float().contiguous() if bias is not None else None

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        xb = x.to(torch.bfloat16)
        if self.packed:
            y = torch.ops.mkldnn._linear_pointwise(xb, self.weight, None, "none", [], "")
        else:
            y = xb @ self.weight
        y = y.float()
        if self.bias is not None:
            y.add_(self.bias)
        return y if residual is None else residual.add_(y)


class Int8Linear:
    """int8 weights, one scale per output channel; activations arrive quantized per row.
    Integer accumulation is exact, so the native kernel (few rows) and torch._int_mm (many
    rows) give bit-identical results."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, native: bool) -> None:
        weight = weight.float()
        self.weight_scale = (weight.abs().amax(dim=1).clamp_min(1e-12) / 127.0).contiguous()
        q = torch.round(weight / self.weight_scale[:, None]).clamp_(-127, 127)
        self.weight = q.to(torch.int8).contiguous()  # [out, in]
        self.weight_colsum = self.weight.sum(dim=1, dtype=torch.int32)
        self.bias = bias.float().contiguous() if bias is not None else None
        self.native = native

    def __call__(
        self, act: QuantizedActivation, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        x_q, x_scale = act
        if self.native and x_q.shape[0] < _NATIVE_INT8_MAX_ROWS:
            return ops.int8_linear(
                x_q,
                x_scale,
                self.weight,
                self.weight_colsum,
                self.weight_scale,
                self.bias,
                residual,
            )
        acc = torch._int_mm(x_q, self.weight.t())
        if self.native:
            return ops.dequant_i32(acc, x_scale, self.weight_scale, self.bias, residual)
        y = acc.float().mul_(x_scale).mul_(self.weight_scale)
        if self.bias is not None:
            y.add_(self.bias)
        return y if residual is None else residual.add_(y)


def prepared(prefetch: WeightPrefetch | None, kind: str, weight: PackedWeight):
    """What the start-up prefetch computed for `kind` on this weight's bytes, or None."""
    if prefetch is None:
        return None
    got = prefetch.take(kind, weight.qtype, weight.rows, weight.cols, weight.data.numpy())
    return None if got is None else torch.from_numpy(got)


# Up to this many rows the packed kernel dequantizes in registers (decode); above, chunks of
# rows are dequantized for a BLAS GEMM (measured on 576 x 1536 and 49152 x 576 weights).
PACKED_GEMV_MAX_ROWS = 8
# Up to this many rows the integer-dot kernels run where the format has them, whatever the
# machine: a decode step of the embedded model (AVX-512 VNNI) with 16 rows takes 60 ms on one
# thread (fp32 GEMM: 118), 39 on two (70); 32 rows 119 / 78 (161 / 93). Beyond it they run up
# to where they were measured faster than the fp32 GEMM on this machine (row_kernels).
INT_DOT_MAX_ROWS = 32
# Up to this many rows (one pass over the weights) the integer-dot GEMV, past them the GEMM,
# which keeps each weight block in L1 across all rows: a layer of the embedded model at 9-32
# rows runs 3-12% faster on it (2 threads, Zen 5). Both round the activations to
# KernelConfig.int_dot_activation_bits (16; 24: 1.5x the dot products, 8: half)
# and give a row the same bits, so a row's result never depends on the other rows of its step.
INT_DOT_GEMV_MAX_ROWS = 8
# fp32 bytes dequantized at a time for the GEMM path (stays in L2/L3, never a full copy)
_DEQUANT_CHUNK_BYTES = 4 << 20


def int_dot_decode(weight: PackedWeight) -> bool:
    """Rows of this weight can run the integer-dot kernels (VNNI or AVX2): Q4_0 / Q4_1 / Q8_0
    / Q4_K / Q6_K with rows in groups of 16 (K-quants: whole 256-value super-blocks), on a
    build with a vector implementation (KernelConfig.int_dot off keeps the fp32 GEMV)."""
    return ops.int_dot_kind() > 0 and ops.int_dot_supported(weight)


# Fewer greedy rows read out every logit instead: there the readout is bound by reading the
# lm_head either way, and the argmax's extra pass made it slower (AMD EPYC: 1.43 vs 1.08 ms
# at 1 row, 1.60-1.80 vs 1.08-1.30 at 2; a 2-core Xeon: even).
GREEDY_ARGMAX_MIN_ROWS = 3


class PackedLinear:
    """y = x @ W^T (+ b) (+ residual) with W packed in GGUF blocks (exact dequantization).

    Few rows run the packed GEMV kernel. Many rows run a float32 GEMM on the exactly
    dequantized weight: a float copy kept beside the packed one when the method's
    dequant cache has room for it (then batched steps cost what float32 costs), else rows
    dequantized in chunks on every call."""

    def __init__(
        self,
        weight: PackedWeight,
        bias: torch.Tensor | None,
        keep_float: bool = False,
        prefetch: WeightPrefetch | None = None,
        int_dot: bool = True,
        activation_bits: int = KernelConfig.int_dot_activation_bits,
    ) -> None:
        """`prefetch`: the start-up prefetch, which may have prepared this weight's repack
        and float copy already (prefetch.py); `int_dot`: KernelConfig.int_dot; `activation_bits`:
        KernelConfig.int_dot_activation_bits."""
        self.weight = weight
        self.bias = bias.float().contiguous() if bias is not None else None
        # up to this many rows run the integer-dot kernels (the method measures it: row_kernels)
        self.int_dot_max_rows = INT_DOT_MAX_ROWS
        self.activation_bits = activation_bits  # the integer-dot kernels' activation precision
        self._argmax_bounds: torch.Tensor | None = None  # greedy_argmax's, made on first use
        self.chunk_rows = max(1, _DEQUANT_CHUNK_BYTES // (4 * weight.cols))
        self._scratch: torch.Tensor | None = None
        # decode rows run integer dot products on a regrouped copy where the format allows
        self.int_dot = None
        if int_dot and int_dot_decode(weight):
            self.int_dot = prepared(prefetch, INT_DOT, weight)
            if self.int_dot is None:
                self.int_dot = ops.int_dot_repack(weight)
        # the float32 method's layer on the same weights: batched results equal its results
        self.float_linear = None
        if keep_float:  # the native dequantizer: bit-exact with gguf's (test_native_weights)
            weight_t = prepared(prefetch, FLOAT_T, weight)
            if weight_t is None:
                weight_t = ops.dequant_matrix_t(weight)
            self.float_linear = FloatLinear(weight_t, bias, transposed=True)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        x = x.contiguous()
        if self.int_dot is not None and x.shape[0] <= self.int_dot_max_rows:
            return self.int_dot_rows(x, residual)
        if x.shape[0] <= PACKED_GEMV_MAX_ROWS:
            return ops.qlinear(x, self.weight, self.bias, residual)
        return self.gemm_rows(x, residual)

    def int_dot_rows(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The integer-dot kernels on x's rows (the layer has them: self.int_dot): the GEMV
        up to INT_DOT_GEMV_MAX_ROWS rows, the GEMM past them (the same bits for a row)."""
        x = x.contiguous()
        bits = self.activation_bits
        if x.shape[0] <= INT_DOT_GEMV_MAX_ROWS:
            return ops.int_dot_linear(x, self.int_dot, self.weight, self.bias, residual, bits)
        return ops.int_dot_gemm(x, self.int_dot, self.weight, self.bias, residual, bits)

    def gemm_rows(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """A float32 GEMM on the dequantized weight: its float copy, else dequantized in
        chunks."""
        x = x.contiguous()
        if self.float_linear is not None:
            return self.float_linear(x, residual)
        w = self.weight
        out = torch.empty(x.shape[0], w.rows, dtype=torch.float32)
        if self._scratch is None:
            self._scratch = torch.empty(min(w.rows, self.chunk_rows) * w.cols)
        for start in range(0, w.rows, self.chunk_rows):
            stop = min(start + self.chunk_rows, w.rows)
            part = PackedWeight(w.qtype, stop - start, w.cols, w.data[start:stop])
            torch.mm(x, ops.dequant_matrix(part, self._scratch).t(), out=out[:, start:stop])
        if self.bias is not None:
            out.add_(self.bias)
        return out if residual is None else residual.add_(out)

    def greedy_argmax(self, x: torch.Tensor) -> torch.Tensor | None:
        """Per row of x, the index of its largest output, bit-exact with
        self(x).max(dim=1).indices (first on ties), from the integer-dot GEMV's high-byte
        estimate of every output and exact outputs only for the few that could be largest: a
        greedy verification row then costs a third of the lm_head's dot products. None where
        this layer runs another kernel for x, x has fewer than GREEDY_ARGMAX_MIN_ROWS rows (or an
        output is not finite)."""
        if self.int_dot is None or self.bias is not None:
            return None
        # the argmax is the integer-dot kernels' (GEMV's and GEMM's) at the layer's bits
        if not GREEDY_ARGMAX_MIN_ROWS <= x.shape[0] <= self.int_dot_max_rows:
            return None
        if self._argmax_bounds is None:
            self._argmax_bounds = ops.int_dot_bound_table(self.int_dot, self.weight)
        out = ops.int_dot_argmax(
            x.contiguous(), self.int_dot, self.weight, self._argmax_bounds, self.activation_bits
        )
        return None if bool((out < 0).any()) else out


class StackedPackedLinear:
    """Row blocks in different packed formats (PackedStack), each its own PackedLinear,
    outputs side by side."""

    def __init__(self, weight: PackedStack, bias: torch.Tensor | None, method) -> None:
        self.parts = [method.linear(p) for p in weight.parts]
        self.bias = bias.float().contiguous() if bias is not None else None

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        y = torch.cat([part(x) for part in self.parts], dim=1)
        if self.bias is not None:
            y.add_(self.bias)
        return y if residual is None else residual.add_(y)


class OutlierLinear:
    """A packed layer plus its outlier input channels in float32 (OutlierSplit)."""

    def __init__(self, weight: OutlierSplit, bias: torch.Tensor | None, method) -> None:
        self.main = method.linear(weight.main, bias)
        self.channels = weight.channels
        self.dense_t = weight.dense.float().t().contiguous()  # [n, rows]

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        y = self.main(x, residual)
        return y.addmm_(x[:, self.channels], self.dense_t)


def dense_table(weight, prefetch: WeightPrefetch | None = None) -> torch.Tensor:
    """A weight in float32; packed ones through the native dequantizer (bit-exact with
    gguf's, and ~10x faster: 0.6 s -> 0.05 s for SmolLM2's embedding table), or as the
    start-up prefetch computed it."""
    if isinstance(weight, PackedWeight) and ops.kernels_available():
        table = prepared(prefetch, ROWS, weight)
        if table is not None:
            return table
        return ops.dequant_matrix(weight, torch.empty(weight.rows * weight.cols))
    return as_float(weight).contiguous()


class FloatMethod:
    name = "float32"
    fused_decode = False  # decode steps in one native call (fused_decode.py)
    prefetch: WeightPrefetch | None = None  # native weights prepared at start-up
    device = torch.device("cpu")  # where weights and activations live
    dtype = torch.float32  # the activations' dtype

    def __init__(self, kernels: KernelConfig | None = None) -> None:
        """`kernels`: the engine's switches (default: the environment's, envs.py)."""
        self.native = ops.kernels_available()
        self.kernels = kernels or KernelConfig.from_env()

    def linear(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> FloatLinear:
        return FloatLinear(weight, bias)

    def param(self, weight: torch.Tensor | PackedWeight) -> torch.Tensor:
        """A small weight (norm scales) where and how this method computes with it."""
        return as_float(weight).contiguous()

    def table(self, weight: torch.Tensor | PackedWeight) -> torch.Tensor:
        """The embedding table, for row lookups."""
        return dense_table(weight, self.prefetch)

    def lm_head(self, weight: torch.Tensor | PackedWeight):
        return self.linear(weight)

    def norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if self.native:
            return ops.rmsnorm(x, weight, eps)
        return F.rms_norm(x, (x.shape[-1],), weight, eps)

    def activation(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """With the native kernels, the one-call decoder's SiLU (poly_expf) on every row: a
        row's activations then do not depend on which path ran its step (the integer-dot
        kernels' rounding would turn an ulp's difference into a digit's), and the native
        method's float32 GEMM rows stay the float32 method's bit for bit."""
        if self.native and gate_up.dtype == torch.float32 and not gate_up.requires_grad:
            return ops.silu_mul(gate_up)
        half = gate_up.shape[1] // 2
        return F.silu(gate_up[:, :half]) * gate_up[:, half:]


class BFloat16Method(FloatMethod):
    """Linear layers in bf16; norms, activations, attention and the KV cache stay fp32."""

    name = "bfloat16"

    def __init__(self, kernels: KernelConfig | None = None) -> None:
        super().__init__(kernels)
        self.packed = packed_bf16_available()

    def linear(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> BFloat16Linear:
        return BFloat16Linear(weight, bias, self.packed)


class Int8ActivationLinear:
    """An int8 (W8A8) layer among float ones: quantizes its own input rows."""

    def __init__(self, weight: torch.Tensor, native: bool) -> None:
        self.linear = Int8Linear(weight, None, native)
        self.native = native

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        act = ops.quantize_rows(x) if self.native else _quantize_rows_torch(x)
        return self.linear(act, residual)


class NativeMethod(FloatMethod):
    """Each linear layer runs the format its weight arrives in: packed GGUF blocks
    (PackedLinear), int8 (Int8Weight, W8A8) or float32; the activations between layers are
    float32. Runs the file's own blocks and every mixed quantization plan."""

    name = "native"

    def __init__(
        self,
        dequant_cache_bytes: int = 0,
        prefetch: WeightPrefetch | None = None,
        kernels: KernelConfig | None = None,
    ) -> None:
        super().__init__(kernels)
        self.prefetch = prefetch
        # float32 copies of packed weights for batched GEMMs, first come first served
        self.dequant_cache_left = dequant_cache_bytes
        # fused_decode off keeps decode steps on the per-layer path
        self.fused_decode = self.native and self.kernels.fused_decode
        self.packed_linears: list[PackedLinear] = []  # for choose_row_kernels

    def choose_row_kernels(self) -> int:
        """Sets up to how many rows the packed layers run the integer-dot kernel, and whether
        its GEMM runs on AMX tiles, as measured for this machine (row_kernels.py), once the
        model is built; returns the row limit."""
        amx_tiles(self.packed_linears)
        limit = int_dot_row_limit(
            self.packed_linears, INT_DOT_MAX_ROWS, self.kernels.int_dot_max_rows
        )
        dropped = 0
        for linear in self.packed_linears:
            linear.int_dot_max_rows = limit
            if (
                limit >= UNLIMITED
                and linear.int_dot is not None
                and linear.float_linear is not None
            ):
                # no step will run its GEMM: give the float copy's memory back
                dropped += 4 * linear.weight.rows * linear.weight.cols
                linear.float_linear = None
        if dropped:
            logger.info("float32 copies of %.0f MB dropped: unused", dropped / 1e6)
        return limit

    def _keep_float(self, weight: PackedWeight) -> bool:
        nbytes = 4 * weight.rows * weight.cols
        if nbytes > self.dequant_cache_left:
            return False
        self.dequant_cache_left -= nbytes
        return True

    def linear(
        self, weight: torch.Tensor | PackedWeight | Int8Weight, bias: torch.Tensor | None = None
    ):
        if isinstance(weight, PackedWeight) and self.native:
            keep_float = self._keep_float(weight)
            linear = PackedLinear(
                weight,
                bias,
                keep_float,
                self.prefetch,
                self.kernels.int_dot,
                self.kernels.int_dot_activation_bits,
            )
            self.packed_linears.append(linear)
            return linear
        if isinstance(weight, PackedStack) and self.native:
            return StackedPackedLinear(weight, bias, self)
        if isinstance(weight, OutlierSplit) and self.native:
            return OutlierLinear(weight, bias, self)
        if isinstance(weight, Int8Weight) and bias is None:
            return Int8ActivationLinear(weight.weight, self.native)
        return FloatLinear(as_float(weight), bias)


class Int8Method(FloatMethod):
    name = "int8"

    def linear(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Int8Linear:
        return Int8Linear(weight, bias, self.native)

    def norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> QuantizedActivation:
        if self.native:
            return ops.rmsnorm_quant(x, weight, eps)
        return _quantize_rows_torch(F.rms_norm(x, (x.shape[-1],), weight, eps))

    def activation(self, x: torch.Tensor) -> QuantizedActivation:
        return ops.quantize_rows(x) if self.native else _quantize_rows_torch(x)

    def silu_mul(self, gate_up: torch.Tensor) -> QuantizedActivation:
        if self.native:
            return ops.silu_mul_quant(gate_up)
        return _quantize_rows_torch(super().silu_mul(gate_up))


def _quantize_rows_torch(x: torch.Tensor) -> QuantizedActivation:
    scale = x.abs().amax(dim=1, keepdim=True).clamp_min_(1e-12).div_(127.0)
    return torch.round(x / scale).to(torch.int8), scale


def get_linear_method(
    weights: str,
    dequant_cache_bytes: int = 0,
    prefetch: WeightPrefetch | None = None,
    kernels: KernelConfig | None = None,
    device: str = "cpu",
) -> FloatMethod:
    """The method for `--weights` on `device`: on the CPU native, float32, bfloat16, int8 or
    fp8; on CUDA bf16 (native, bfloat16), float32 or fp8 (device_method.py). `dequant_cache_bytes`:
    how much float32 the native method may keep beside packed weights for batched GEMMs;
    `prefetch`: native weights prepared at start-up; `kernels`: which kernels run (default:
    the environment's, envs.py)."""
    if weights == "fp8" or device != "cpu":
        from tokenmill.model.device_method import device_method

        return device_method(weights, device)
    methods = {
        "native": NativeMethod,
        "float32": FloatMethod,
        "bfloat16": BFloat16Method,
        "int8": Int8Method,
    }
    if weights not in methods:
        raise ValueError(f"weights: unsupported value {weights!r} (one of {list(methods)})")
    if weights == "native":
        return NativeMethod(dequant_cache_bytes, prefetch, kernels)
    return methods[weights](kernels)
