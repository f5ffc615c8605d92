"""Load a Llama-family model from a GGUF file or a Hugging Face safetensors folder."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from tokenmill.model.dummy_weights import dummy_weights
from tokenmill.model.gguf_file import F16, F32, GGUFFile
from tokenmill.model.gguf_layout import (
    GGUF_CONFIG_TENSORS,
    GGUF_EXPERT_TENSORS,
    GGUF_LAYER_OVERRIDES,
    GGUF_LAYER_TO_HF,
    GGUF_TO_HF,
    LAYER_RE,
    expert_rows,
    packed_rows,
    rope_permuted,
    unpermute_rope_weight,
    unpermuted_row_order,
)
from tokenmill.model.model_files import (
    ModelFiles,
    gguf_model_info,
    hf_model_info,
    model_source,
    read_model_info,
)
from tokenmill.model.packed import PackedWeight
from tokenmill.model.prefetch import WeightPrefetch


def load_model_files(
    model: str | None,
    with_weights: bool = True,
    packed: bool = False,
    prefetch: WeightPrefetch | None = None,
    load_format: str = "auto",
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> ModelFiles:
    """Reads a model; `with_weights=False` reads only what a front end needs (tokenizer,
    chat template, architecture: model_files.read_model_info, which is fast and torch-free).
    `prefetch`: a start-up prefetch of this model that has read the GGUF header already.
    `load_format` "dummy": random weights made on `device` in `dtype` (dummy_weights.py)."""
    if not with_weights:
        return read_model_info(model)
    name, path, kind = model_source(model)
    if load_format == "dummy":
        if kind != "hf":
            raise ValueError(f"load_format: dummy needs a folder with config.json, got {path}")
        files = hf_model_info(name, path)
        files.weights.update(dummy_weights(path, device, dtype))
        return files
    if kind == "gguf":
        return _load_gguf(name, path, packed, prefetch.gguf_file() if prefetch else None)
    return _load_hf_folder(name, path)


# ---------------------------------------------------------------- GGUF


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
    found = packed_rows(tensor)
    if found is None:
        return None
    qtype, rows, cols, data = found
    with warnings.catch_warnings():  # the file's read-only memory map: never written to
        warnings.simplefilter("ignore", UserWarning)
        return PackedWeight(qtype, rows, cols, torch.from_numpy(data))


def _load_gguf(
    name: str,
    path: Path,
    packed: bool = False,
    gguf: GGUFFile | None = None,
) -> ModelFiles:
    """`packed`: 2-D weights in a format with native kernels (packed.PACKED_TYPES) stay as
    the file stores them. `gguf`: the file's header, read already."""
    gguf = gguf or GGUFFile(path)
    files = gguf_model_info(name, path, gguf)
    arch = files.arch
    gguf_arch = gguf.metadata["general.architecture"]
    permuted = rope_permuted(gguf_arch)
    layer_names = {**GGUF_LAYER_TO_HF, **GGUF_LAYER_OVERRIDES.get(gguf_arch, {})}
    weights = files.weights
    for tname, tensor in ((t.name, t) for t in gguf.tensors):
        if tname in GGUF_CONFIG_TENSORS:
            continue  # read into the ArchConfig
        match = LAYER_RE.fullmatch(tname)
        if match and match.group(2) in GGUF_EXPERT_TENSORS:
            layer, rest = match.groups()
            prefix = f"model.layers.{layer}.mlp.experts."
            for e, w in enumerate(_expert_weights(tensor, packed)):
                weights[f"{prefix}{e}.{GGUF_EXPERT_TENSORS[rest]}"] = w
            continue
        kept = _packed(tensor) if packed else None
        data = dequantize_tensor(tensor) if kept is None else None
        if tname == "rope_freqs.weight":
            files.rope_freq_factors = torch.from_numpy(data.copy())
            continue
        if match:
            layer, rest = match.groups()
            if rest not in layer_names:
                raise ValueError(f"{path}: unsupported tensor {tname}")
            hf_name = f"model.layers.{layer}.{layer_names[rest]}"
            heads = None
            if permuted and rest in ("attn_q.weight", "attn_q.bias"):
                heads = arch.num_attention_heads
            elif permuted and rest in ("attn_k.weight", "attn_k.bias"):
                heads = arch.num_key_value_heads
            if heads is not None and kept is not None:
                kept = kept.permute_rows(unpermuted_row_order(kept.rows, heads))
            elif heads is not None:
                data = unpermute_rope_weight(data, heads)
        elif tname in GGUF_TO_HF:
            hf_name = GGUF_TO_HF[tname]
        else:
            raise ValueError(f"{path}: unsupported tensor {tname}")
        if arch.architecture == "gemma3" and tname.endswith("norm.weight"):
            data = data - 1.0  # llama.cpp stores Gemma's (1 + w); the model adds the 1
        weights[hf_name] = (
            kept
            if kept is not None
            else torch.from_numpy(np.array(data, dtype=np.float32, order="C"))
        )
    return files


def _expert_weights(tensor, packed: bool) -> list:
    """A 3-D expert tensor as one weight per expert: packed rows where the native kernels
    run the format (`packed`), float32 otherwise."""
    parts = expert_rows(tensor) if packed else None
    if parts is not None:
        with warnings.catch_warnings():  # the file's read-only memory map: never written to
            warnings.simplefilter("ignore", UserWarning)
            return [PackedWeight(q, r, c, torch.from_numpy(d)) for q, r, c, d in parts]
    data = dequantize_tensor(tensor)
    return [torch.from_numpy(np.array(d, dtype=np.float32, order="C")) for d in data]


# ---------------------------------------------------------------- HF folder


def _load_hf_folder(name: str, path: Path) -> ModelFiles:
    from safetensors.torch import load_file

    files = hf_model_info(name, path)
    safetensors = sorted(path.glob("*.safetensors"))
    if not safetensors:
        raise ValueError(f"{path}: no *.safetensors files")
    for f in safetensors:
        try:
            tensors = load_file(str(f))
        except Exception as e:  # safetensors' own error for a truncated or foreign file
            raise ValueError(f"{f}: not a safetensors file ({e})") from None
        for key, value in tensors.items():
            files.weights[key] = value.float()
    return files
