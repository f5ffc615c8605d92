"""How a GGUF file lays out a Llama-family model, without torch: the packed block formats,
GGUF tensor names -> Hugging Face names, and llama.cpp's q/k row order. Shared by the
loader and the start-up prefetch (which runs before torch is imported)."""

from __future__ import annotations

import re

import numpy as np

# GGML type id -> (name, bytes per block)
PACKED_TYPES = {
    2: ("Q4_0", 18),
    3: ("Q4_1", 20),
    6: ("Q5_0", 22),
    7: ("Q5_1", 24),
    8: ("Q8_0", 34),
    12: ("Q4_K", 144),
    14: ("Q6_K", 210),
}
BLOCK = 32  # values per block
K_BLOCK = 256  # values per super-block of the K formats
_K_TYPES = frozenset({12, 14})


def block_values(qtype: int) -> int:
    """Values per block of a packed format: 32, or 256 for the K formats."""
    return K_BLOCK if qtype in _K_TYPES else BLOCK


GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
GGUF_LAYER_TO_HF = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    # the families in model/models/
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_qkv.weight": "self_attn.qkv_proj.weight",
    "attn_qkv.bias": "self_attn.qkv_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_sinks.weight": "self_attn.sinks",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_inp.bias": "mlp.gate.bias",
}
# where a family's GGUF names mean something else than the Llama ones
GGUF_LAYER_OVERRIDES = {
    "gemma3": {"ffn_norm.weight": "pre_feedforward_layernorm.weight"},
    "phi3": {"ffn_up.weight": "mlp.gate_up_proj.weight"},  # gate and up stored fused
}
# 3-D [experts, rows, cols] tensors -> one weight per expert: mlp.experts.{e}.<name>
GGUF_EXPERT_TENSORS = {
    "ffn_gate_exps.weight": "gate_proj.weight",
    "ffn_up_exps.weight": "up_proj.weight",
    "ffn_down_exps.weight": "down_proj.weight",
    "ffn_gate_exps.bias": "gate_proj.bias",
    "ffn_up_exps.bias": "up_proj.bias",
    "ffn_down_exps.bias": "down_proj.bias",
}
# tensors that configure the model (read into ArchConfig), not weights
GGUF_CONFIG_TENSORS = ("rope_factors_long.weight", "rope_factors_short.weight")
LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")


def packed_rows(tensor) -> tuple[int, int, int, np.ndarray] | None:
    """(format, rows, cols, uint8 [rows, row bytes] view of the file) for a GGUFTensor that
    is a 2-D weight in a format the native kernels run; else None."""
    qtype = int(tensor.tensor_type)
    if qtype not in PACKED_TYPES or len(tensor.shape) != 2:
        return None
    cols, rows = (int(d) for d in tensor.shape)
    return qtype, rows, cols, np.ascontiguousarray(tensor.data, dtype=np.uint8).reshape(rows, -1)


def expert_rows(tensor) -> list[tuple[int, int, int, np.ndarray]] | None:
    """Per expert, (format, rows, cols, uint8 rows) of a 3-D expert tensor in a packed
    format the native kernels run; else None."""
    qtype = int(tensor.tensor_type)
    if qtype not in PACKED_TYPES or len(tensor.shape) != 3:
        return None
    cols, rows, experts = (int(d) for d in tensor.shape)
    data = np.ascontiguousarray(tensor.data, dtype=np.uint8).reshape(experts, rows, -1)
    return [(qtype, rows, cols, data[e]) for e in range(experts)]


def rope_permuted(architecture: str) -> bool:
    """llama.cpp permutes q/k rows for the "llama" architecture only (Mistral ships as llama)."""
    return architecture in ("llama", "mistral")


def unpermute_rope_weight(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's converter permutation of q/k rows (interleaved pairs -> rotate-half)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermuted_row_order(rows: int, n_heads: int) -> np.ndarray:
    """The row order that undoes the permutation on a packed weight (rows move whole)."""
    return unpermute_rope_weight(np.arange(rows)[:, None], n_heads).ravel()
