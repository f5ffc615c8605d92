"""Load a Llama-family model from a GGUF file or a Hugging Face safetensors folder."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import torch

from tokenmill.model.gguf_file import F16, F32, GGUFFile
from tokenmill.model.model_files import (
    ModelFiles,
    gguf_model_info,
    hf_model_info,
    model_source,
    read_model_info,
)
from tokenmill.model.packed import PACKED_TYPES, PackedWeight


def load_model_files(
    model: str | None, with_weights: bool = True, packed: bool = False
) -> ModelFiles:
    """Reads a model; `with_weights=False` reads only what a front end needs (tokenizer,
    chat template, architecture: model_files.read_model_info, which is fast and torch-free)."""
    if not with_weights:
        return read_model_info(model)
    name, path, kind = model_source(model)
    if kind == "gguf":
        return _load_gguf(name, path, packed)
    return _load_hf_folder(name, path)


# ---------------------------------------------------------------- GGUF

_GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_LAYER_TO_HF = {
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
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")


def unpermute_rope_weight(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's converter permutation of q/k rows (interleaved pairs -> rotate-half)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dequantize_tensor(tensor) -> np.ndarray:
    shape = tuple(int(d) for d in reversed(tensor.shape))
    if tensor.tensor_type in (F32, F16):
        data = np.asarray(tensor.data, dtype=np.float32)
    else:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        data = dequantize(tensor.data, GGMLQuantizationType(tensor.tensor_type))
    return data.reshape(shape)


def _packed(tensor) -> PackedWeight | None:
    """The tensor as stored, if it is a 2-D weight in a format the native kernels run."""
    qtype = int(tensor.tensor_type)
    if qtype not in PACKED_TYPES or len(tensor.shape) != 2:
        return None
    cols, rows = (int(d) for d in tensor.shape)
    with warnings.catch_warnings():  # the file's read-only memory map: never written to
        warnings.simplefilter("ignore", UserWarning)
        data = torch.from_numpy(np.ascontiguousarray(tensor.data, dtype=np.uint8))
    return PackedWeight(qtype, rows, cols, data.view(rows, -1))


def _load_gguf(name: str, path: Path, packed: bool = False) -> ModelFiles:
    """`packed`: 2-D weights in a format with native kernels (packed.PACKED_TYPES) stay as
    the file stores them."""
    gguf = GGUFFile(path)
    files = gguf_model_info(name, path, gguf)
    arch = files.arch
    # llama.cpp permutes q/k rows for the "llama" architecture only (Mistral ships as llama).
    permuted = gguf.metadata["general.architecture"] in ("llama", "mistral")
    weights = files.weights
    for tname, tensor in ((t.name, t) for t in gguf.tensors):
        kept = _packed(tensor) if packed else None
        data = dequantize_tensor(tensor) if kept is None else None
        if tname == "rope_freqs.weight":
            files.rope_freq_factors = torch.from_numpy(data.copy())
            continue
        match = _LAYER_RE.fullmatch(tname)
        if match:
            layer, rest = match.groups()
            if rest not in _GGUF_LAYER_TO_HF:
                raise ValueError(f"{path}: unsupported tensor {tname}")
            hf_name = f"model.layers.{layer}.{_GGUF_LAYER_TO_HF[rest]}"
            heads = None
            if permuted and rest in ("attn_q.weight", "attn_q.bias"):
                heads = arch.num_attention_heads
            elif permuted and rest in ("attn_k.weight", "attn_k.bias"):
                heads = arch.num_key_value_heads
            if heads is not None and kept is not None:
                order = unpermute_rope_weight(np.arange(kept.rows)[:, None], heads).ravel()
                kept = kept.permute_rows(order)
            elif heads is not None:
                data = unpermute_rope_weight(data, heads)
        elif tname in _GGUF_TO_HF:
            hf_name = _GGUF_TO_HF[tname]
        else:
            raise ValueError(f"{path}: unsupported tensor {tname}")
        weights[hf_name] = (
            kept
            if kept is not None
            else torch.from_numpy(np.array(data, dtype=np.float32, order="C"))
        )
    return files


# ---------------------------------------------------------------- HF folder


def _load_hf_folder(name: str, path: Path) -> ModelFiles:
    from safetensors.torch import load_file

    files = hf_model_info(name, path)
    safetensors = sorted(path.glob("*.safetensors"))
    if not safetensors:
        raise ValueError(f"{path}: no *.safetensors files")
    for f in safetensors:
        for key, value in load_file(str(f)).items():
            files.weights[key] = value.float()
    return files
