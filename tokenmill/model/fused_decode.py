"""Decode steps of the native method in one native call for all decoder layers.

When every projection of every layer runs the integer-dot GEMV (packed Q4_0 / Q4_1 / Q8_0 /
Q4_K / Q6_K weights, PackedLinear.int_dot) and a step holds only single-token rows (at most 8: the
GEMV's range), `tm_decode_layers` (kernels/csrc/decode_layers.c) runs the layers with the
same kernels the per-layer path calls, in the same order, minus the ~15 torch and ctypes
calls per layer that cost about a third of a decode token on the embedded model. Any other
step, model or method takes the per-layer path.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from tokenmill.kernels.build import load_kernels
from tokenmill.model.attention import AttentionMetadata, CPUPagedBackend
from tokenmill.model.linear import PACKED_GEMV_MAX_ROWS, PackedLinear


class DecodeModel(Protocol):
    """What the fused decoder reads of a model (model/llama.py's DecodeModel)."""

    config: Any  # ArchConfig
    layers: Sequence[Any]  # decoder layers: projections and norms
    rope: Any  # its cos / sin tables
    method: Any  # how its weights run (fused_decode: whether it may)


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
    ]


class DecodeDims(ctypes.Structure):
    _fields_ = [
        *((name, _i64) for name in ("hidden", "heads", "kv_heads", "head_dim", "intermediate")),
        *((name, _i64) for name in ("block_size", "num_blocks", "window")),
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        ("cos", _ptr),
        ("sin", _ptr),
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
    """The native per-step call for one model and one set of KV caches."""

    def __init__(self, model: DecodeModel, kv_caches: list[torch.Tensor], attn: CPUPagedBackend):
        cfg = model.config
        self.layers = (DecodeLayer * len(model.layers))()
        for i, (layer, kv) in enumerate(zip(model.layers, kv_caches, strict=True)):
            self.layers[i] = DecodeLayer(
                layer.input_norm.data_ptr(),
                layer.post_attn_norm.data_ptr(),
                kv.data_ptr(),
                projection_of(layer.qkv_proj),
                projection_of(layer.o_proj),
                projection_of(layer.gate_up_proj),
                projection_of(layer.down_proj),
            )
        self.dims = DecodeDims(
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cfg.intermediate_size,
            attn.block_size,
            kv_caches[0].shape[1],
            attn.sliding_window or 0,
            cfg.rms_norm_eps,
            attn.scale,
            model.rope.cos.data_ptr(),
            model.rope.sin.data_ptr(),
        )

    @staticmethod
    def supports(model: DecodeModel, kv_caches: list[torch.Tensor], attn) -> bool:
        projections = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
        return (
            model.method.fused_decode
            and isinstance(attn, CPUPagedBackend)
            and all(kv.dtype == torch.float32 and kv.is_contiguous() for kv in kv_caches)
            and all(runs_int_dot(getattr(layer, p)) for layer in model.layers for p in projections)
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


def decode_only(meta: AttentionMetadata, num_tokens: int) -> bool:
    """A step of single-token rows only, few enough for the integer-dot GEMV."""
    return not meta.chunks and meta.num_decode_tokens == num_tokens <= PACKED_GEMV_MAX_ROWS
