"""Load a Llama-family model from a GGUF file or a Hugging Face safetensors folder."""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tokenmill.model.arch_config import ArchConfig
from tokenmill.model.chat_template import ChatTemplate
from tokenmill.model.embedded import EMBEDDED_MODEL_NAME, embedded_model_path
from tokenmill.model.packed import PACKED_TYPES, PackedWeight
from tokenmill.model.tokenizer import Tokenizer, tokenizer_from_files, tokenizer_from_gguf


@dataclass
class ModelFiles:
    """Everything read from a model file, before the weights become a runnable model."""

    name: str
    path: Path
    arch: ArchConfig
    # Hugging Face names; float32, or packed GGUF blocks when loaded with packed=True
    weights: dict[str, torch.Tensor | PackedWeight]
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    rope_freq_factors: torch.Tensor | None = None


def resolve_model_path(model: str | None) -> tuple[str, Path]:
    if model is None:
        return EMBEDDED_MODEL_NAME, embedded_model_path()
    path = Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"model path {model!r} does not exist (models load from a local GGUF file or HF folder)"
        )
    name = path.stem if path.is_file() else path.name
    return name, path


def load_model_files(
    model: str | None, with_weights: bool = True, packed: bool = False
) -> ModelFiles:
    """Reads a model; `with_weights=False` reads only what a front end needs (tokenizer,
    chat template, architecture), which is fast."""
    name, path = resolve_model_path(model)
    if path.is_file() and path.suffix == ".gguf":
        return _load_gguf(name, path, with_weights, packed)
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if (path / "config.json").exists():
            return _load_hf_folder(name, path, with_weights)
        if len(ggufs) == 1:
            return _load_gguf(name, ggufs[0], with_weights, packed)
    raise ValueError(
        f"{path}: expected a .gguf file or a folder with config.json and *.safetensors"
    )


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


def gguf_metadata(reader) -> dict:
    meta = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        meta[key] = field.contents()
    return meta


def unpermute_rope_weight(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's converter permutation of q/k rows (interleaved pairs -> rotate-half)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dequantize_tensor(tensor) -> np.ndarray:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    shape = tuple(int(d) for d in reversed(tensor.shape))
    if tensor.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        data = np.asarray(tensor.data, dtype=np.float32)
    else:
        data = dequantize(tensor.data, tensor.tensor_type)
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


def _load_gguf(name: str, path: Path, with_weights: bool, packed: bool = False) -> ModelFiles:
    """`packed`: 2-D weights in a format with native kernels (packed.PACKED_TYPES) stay as
    the file stores them."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    meta = gguf_metadata(reader)
    tensors = {t.name: t for t in reader.tensors}
    arch = ArchConfig.from_gguf_metadata(
        meta,
        has_output_tensor="output.weight" in tensors,
        has_qkv_bias="blk.0.attn_q.bias" in tensors,
    )
    # llama.cpp permutes q/k rows for the "llama" architecture only (Mistral ships as llama).
    permuted = meta["general.architecture"] in ("llama", "mistral")
    weights: dict[str, torch.Tensor | PackedWeight] = {}
    rope_freq_factors = None
    for tname, tensor in tensors.items() if with_weights else ():
        kept = _packed(tensor) if packed else None
        data = dequantize_tensor(tensor) if kept is None else None
        if tname == "rope_freqs.weight":
            rope_freq_factors = torch.from_numpy(data.copy())
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
    tokenizer = tokenizer_from_gguf(meta)
    template = ChatTemplate(
        meta.get("tokenizer.chat_template"), tokenizer.bos_token, tokenizer.eos_token
    )
    return ModelFiles(name, path, arch, weights, tokenizer, template, rope_freq_factors)


# ---------------------------------------------------------------- HF folder


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _load_hf_folder(name: str, path: Path, with_weights: bool) -> ModelFiles:
    from safetensors.torch import load_file

    config = _read_json(path / "config.json")
    arch = ArchConfig.from_hf_config(config)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path}: no *.safetensors files")
    weights: dict[str, torch.Tensor] = {}
    for f in files if with_weights else ():
        for key, value in load_file(str(f)).items():
            weights[key] = value.float()
    if not (path / "tokenizer.json").exists():
        raise ValueError(f"{path}: tokenizer.json is missing")
    tok_config = _read_json(path / "tokenizer_config.json")
    gen_config = _read_json(path / "generation_config.json")
    eos = gen_config.get("eos_token_id", config.get("eos_token_id"))
    eos_ids = eos if isinstance(eos, list) else ([eos] if eos is not None else [])
    tokenizer = tokenizer_from_files(str(path / "tokenizer.json"), tok_config, eos_ids)
    template_source = tok_config.get("chat_template")
    if isinstance(template_source, list):  # named templates: take "default"
        template_source = next(
            (t["template"] for t in template_source if t.get("name") == "default"), None
        )
    jinja_file = path / "chat_template.jinja"
    if template_source is None and jinja_file.exists():
        template_source = jinja_file.read_text()
    template = ChatTemplate(template_source, tokenizer.bos_token, tokenizer.eos_token)
    return ModelFiles(name, path, arch, weights, tokenizer, template)
