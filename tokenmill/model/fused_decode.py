"""Decode steps of the native method in one native call for all decoder layers.

When every projection of every layer runs the integer-dot kernels (packed Q4_0 / Q4_1 / Q8_0 /
Q4_K / Q6_K weights, PackedLinear.int_dot) and a step holds only single-token rows (no more
than the layers run those kernels for: row_kernels.py's limit), `tm_decode_layers`
(kernels/csrc/decode_layers.c) runs the layers with the same kernels the per-layer path calls,
in the same order, minus the ~15 torch and ctypes calls per layer that cost about a third of a
decode token on the embedded model. Any other step, model or method takes the per-layer path.
Llama layers run it, and the families' layers of the same shape (models/decoder.py: Qwen2,
Qwen3 with its per-head q/k norms, SmolLM3, Gemma 3 with its sandwich norms, GELU and
alternating windows and RoPE bases, Phi-3 / Phi-4 with LongRoPE and partial rotation...): a
SiLU- or GELU-gated MLP, NeoX RoPE.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import torch

from tokenmill.kernels import ops
from tokenmill.kernels.build import load_kernels
from tokenmill.model.attention import AttentionMetadata, CPUPagedBackend
from tokenmill.model.linear import PackedLinear


@dataclass
class FusedLayer:
    """One decoder layer as the one-call decoder runs it (the model's own tensors)."""

    input_norm: torch.Tensor
    post_attn_norm: torch.Tensor
    qkv: Any  # projections: PackedLinear where the layer can run here
    o: Any
    gate_up: Any
    down: Any
    rope: Any  # RotaryEmbedding: cos / sin tables [positions, rotary_dim / 2]
    scale: float  # attention scale
    window: int | None  # sliding window
    q_norm: torch.Tensor | None = None  # per-head RMSNorm weights (Qwen3)
    k_norm: torch.Tensor | None = None
    # sandwich norms (Gemma 3): post_attn_norm then normalizes the attention's output, these
    # the MLP's input and output
    pre_ff_norm: torch.Tensor | None = None
    post_ff_norm: torch.Tensor | None = None
    gelu: bool = False  # GELU (tanh) gates the MLP, not SiLU

    @property
    def projections(self) -> tuple:
        return self.qkv, self.o, self.gate_up, self.down


_i64, _ptr = ctypes.c_int64, ctypes.c_void_p


class Projection(ctypes.Structure):
    _fields_ = [
        *(("weight", _ptr), ("bias", _ptr), ("qtype", _i64), ("rows", _i64)),
        ("bits", _i64),  # the activations' precision: the per-layer path's (activation_bits)
    ]


class DecodeLayer(ctypes.Structure):
    _fields_ = [
        ("input_norm", _ptr),
        ("post_attn_norm", _ptr),
        ("kv_cache", _ptr),
        ("qkv", Projection),
        ("o", Projection),
        ("gate_up", Projection),
        ("down", Projection),
        ("q_norm", _ptr),
        ("k_norm", _ptr),
        ("pre_ff_norm", _ptr),
        ("post_ff_norm", _ptr),
        ("cos", _ptr),  # the layer's RoPE tables
        ("sin", _ptr),
        ("rotary_dim", _i64),
        ("window", _i64),
        ("scale", ctypes.c_float),
        ("gelu", ctypes.c_int32),
    ]


class DecodeDims(ctypes.Structure):
    _fields_ = [
        *((name, _i64) for name in ("hidden", "heads", "kv_heads", "head_dim", "intermediate")),
        *((name, _i64) for name in ("block_size", "num_blocks")),
        ("kv_half", _i64),  # the KV pool holds float16
        ("eps", ctypes.c_float),
    ]


class DecodeStep(ctypes.Structure):
    _fields_ = [
        ("rows", _i64),
        ("max_blocks", _i64),
        ("positions", _ptr),
        ("slot_mapping", _ptr),
        ("block_table", _ptr),
        ("seq_lens", _ptr),
    ]


def projection_of(linear: PackedLinear) -> Projection:
    bias = linear.bias.data_ptr() if linear.bias is not None else None
    w = linear.weight
    return Projection(linear.int_dot.data_ptr(), bias, w.qtype, w.rows, linear.activation_bits)


def runs_int_dot(linear) -> bool:
    return type(linear) is PackedLinear and linear.int_dot is not None


class FusedDecoder:
    """The native per-step call for one model's layers and one set of KV caches."""

    def __init__(self, config: Any, layers: list[FusedLayer], kv_caches: list[torch.Tensor],
                 attn: CPUPagedBackend):  # fmt: skip
        self.layers = (DecodeLayer * len(layers))()
        for i, (layer, kv) in enumerate(zip(layers, kv_caches, strict=True)):
            norms = (layer.q_norm, layer.k_norm, layer.pre_ff_norm, layer.post_ff_norm)
            self.layers[i] = DecodeLayer(
                layer.input_norm.data_ptr(),
                layer.post_attn_norm.data_ptr(),
                kv.data_ptr(),
                projection_of(layer.qkv),
                projection_of(layer.o),
                projection_of(layer.gate_up),
                projection_of(layer.down),
                *(None if w is None else w.data_ptr() for w in norms),
                layer.rope.cos.data_ptr(),
                layer.rope.sin.data_ptr(),
                2 * layer.rope.cos.shape[1],  # partial rotation: the first dims of a head
                layer.window or 0,
                layer.scale,
                layer.gelu,
            )
        # the most rows a step may have here: what every projection runs the integer-dot
        # kernels for (row_kernels.py's measured limit)
        self.max_rows = min(p.int_dot_max_rows for x in layers for p in x.projections)
        self.dims = DecodeDims(
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            config.intermediate_size,
            attn.block_size,
            kv_caches[0].shape[1],
            kv_caches[0].dtype == torch.float16,
            config.rms_norm_eps,
        )

    @staticmethod
    def supports(
        method: Any, layers: list[FusedLayer] | None, kv_caches: list[torch.Tensor], attn
    ) -> bool:
        """Every layer has a form here (`layers`) and runs every projection on the
        integer-dot GEMV; the KV pools are one dtype the native attention reads."""
        if not layers or not method.fused_decode or not isinstance(attn, CPUPagedBackend):
            return False
        return (
            all(kv.dtype in ops.KV_POOL_DTYPES and kv.is_contiguous() for kv in kv_caches)
            and len({kv.dtype for kv in kv_caches}) == 1
            and all(runs_int_dot(p) for x in layers for p in x.projections)
            and all(
                (x.q_norm is None) == (x.k_norm is None)
                and (x.pre_ff_norm is None) == (x.post_ff_norm is None)
                for x in layers
            )  # fmt: skip
        )

    def forward(
        self, hidden: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        table = meta.decode_block_table.contiguous()
        step = DecodeStep(
            hidden.shape[0],
            table.shape[1],
            positions.data_ptr(),
            meta.slot_mapping.data_ptr(),
            table.data_ptr(),
            meta.decode_seq_lens.data_ptr(),
        )
        hidden = hidden.contiguous()
        load_kernels().tm_decode_layers(
            ctypes.addressof(self.layers),
            len(self.layers),
            ctypes.addressof(self.dims),
            ctypes.addressof(step),
            hidden.data_ptr(),
            torch.get_num_threads(),
        )
        return hidden


class OneCallDecoding:
    """The models whose decode steps may run in one native call (llama.py, models/decoder.py):
    they set `_fused_decode = FusedDecode()` and give their layers' forms (`fused_layers`)."""

    _fused_decode: FusedDecode

    def _fused_decoder(self, kv_caches: list[torch.Tensor], attn) -> FusedDecoder | None:
        """The one-call decode path for these KV caches, when every layer can run it."""
        return self._fused_decode.get(self, kv_caches, attn)

    @property
    def _fused(self) -> FusedDecoder | None:
        return self._fused_decode.decoder

    def decode_in_one_call(
        self, hidden: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
        attn, meta: AttentionMetadata,
    ) -> torch.Tensor | None:  # fmt: skip
        """The step's last hidden states from the one-call decoder; None where the model or
        this step cannot run it (then the layers run one by one)."""
        fused = self._fused_decoder(kv_caches, attn)
        if fused is None or not decode_only(meta, hidden.shape[0], fused.max_rows):
            return None
        return fused.forward(hidden, positions, meta)


class FusedDecode:
    """A model's one-call decoder, built at the first step with a given set of KV caches
    (None where the model or the step's setup cannot run it)."""

    def __init__(self) -> None:
        self.decoder: FusedDecoder | None = None
        self._checked_for: list[torch.Tensor] | None = None

    def get(self, model: Any, kv_caches: list[torch.Tensor], attn) -> FusedDecoder | None:
        """`model`: config, method and fused_layers(attn) (the layers' forms, or None)."""
        if self._checked_for is not kv_caches:
            self._checked_for = kv_caches
            layers = model.fused_layers(attn)
            ok = FusedDecoder.supports(model.method, layers, kv_caches, attn)
            self.decoder = FusedDecoder(model.config, layers, kv_caches, attn) if ok else None
        return self.decoder


def decode_only(meta: AttentionMetadata, num_tokens: int, max_rows: int) -> bool:
    """A step of single-token rows only, at most `max_rows` of them."""
    return not meta.chunks and meta.num_decode_tokens == num_tokens <= max_rows
