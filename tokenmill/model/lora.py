"""LoRA adapters read from disk: PEFT folders (`adapter_config.json` +
`adapter_model.safetensors`) and GGUF LoRA files as llama.cpp's `convert_lora_to_gguf.py`
writes them. An adapter is a set of low-rank deltas W + (alpha/r)·B·A on the decoder's
linear layers; here each one is kept as (A [r, in], scaled B [out, r]) per (layer, module),
checked against the base model's shapes and the server's rank limit."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

# The decoder modules an adapter may target (Hugging Face names).
LORA_MODULES = (
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    "qkv_proj", "gate_up_proj",  # Phi-3 / Phi-4 store these fused
)  # fmt: skip
_PEFT_KEY = re.compile(
    r"(?:.*\.)?layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.[^.]+)?\.weight"
)
_GGUF_KEY = re.compile(r"blk\.(\d+)\.(\w+)\.weight\.lora_([ab])")
_GGUF_MODULES = {
    "attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj",
    "ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj",
}  # fmt: skip


@dataclass
class LoRAAdapter:
    name: str
    path: str
    # (layer, module) -> (A [r, in], B [out, r] with the scaling alpha/r folded in)
    deltas: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(repr=False)
    lora_id: int = 0  # vLLM's lora_int_id: KV events carry it

    @property
    def rank(self) -> int:
        return max(a.shape[0] for a, _ in self.deltas.values())

    @property
    def modules(self) -> list[str]:
        return sorted({m for _, m in self.deltas}, key=LORA_MODULES.index)


def load_lora(name: str, path: str) -> LoRAAdapter:
    """The adapter at `path` (a PEFT folder or a GGUF LoRA file); FileNotFoundError when
    it is not there, ValueError naming what is wrong with it."""
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"lora_path: {path!r} does not exist")
    if p.is_file() and p.suffix == ".gguf":
        return _load_gguf_lora(name, p)
    if p.is_dir() and (p / "adapter_config.json").exists():
        return _load_peft(name, p)
    raise FileNotFoundError(
        f"lora_path: {path!r} is neither a PEFT folder (adapter_config.json + "
        "adapter_model.safetensors) nor a .gguf LoRA file"
    )


def _load_peft(name: str, folder: Path) -> LoRAAdapter:

    try:
        config = json.loads((folder / "adapter_config.json").read_text())
    except ValueError as e:
        raise ValueError(f"adapter_config.json: not JSON ({e})") from None
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"peft_type: {config.get('peft_type')!r} is not LORA")
    for key, ok in (
        ("use_dora", not config.get("use_dora")),
        ("fan_in_fan_out", not config.get("fan_in_fan_out")),
        ("bias", config.get("bias", "none") == "none"),
        ("modules_to_save", not config.get("modules_to_save")),
    ):
        if not ok:
            raise ValueError(f"{key}: {config.get(key)!r} is not supported (plain LoRA only)")
    tensors = _peft_tensors(folder)
    pairs = _pairs(tensors, _PEFT_KEY, "AB", lambda m: m)
    alpha = float(config.get("lora_alpha", config.get("r", 8)))
    alpha_pattern = config.get("alpha_pattern") or {}
    names = _module_names(tensors)
    deltas = {}
    for (layer, module), (a, b) in pairs.items():
        r = a.shape[0]  # rank_pattern's rank where it sets one
        a_alpha = _pattern_value(alpha_pattern, names[(layer, module)], alpha)
        scale = a_alpha / math.sqrt(r) if config.get("use_rslora") else a_alpha / r
        deltas[(layer, module)] = (a.float().contiguous(), (b.float() * scale).contiguous())
    return LoRAAdapter(name, str(folder), deltas)


def _peft_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """adapter_model.safetensors, or the older adapter_model.bin (tensors only: loaded with
    torch's weights_only unpickler, which runs no code from the file)."""
    from safetensors.torch import load_file

    weights_file = folder / "adapter_model.safetensors"
    if weights_file.exists():
        try:
            return load_file(str(weights_file))
        except Exception as e:  # safetensors' own error for a truncated or foreign file
            raise ValueError(f"adapter_model.safetensors: not a safetensors file ({e})") from None
    legacy = folder / "adapter_model.bin"
    if legacy.exists():
        try:
            tensors = torch.load(legacy, map_location="cpu", weights_only=True)
        except Exception as e:  # not a tensor pickle, or one that asks for code
            raise ValueError(f"adapter_model.bin: not a file of tensors ({e})") from None
        if not isinstance(tensors, dict):
            raise ValueError("adapter_model.bin: not a dict of tensors")
        return tensors
    raise FileNotFoundError(f"lora_path: {weights_file} is missing")


def _module_names(tensors: dict) -> dict[tuple[int, str], str]:
    """(layer, module) -> the module's name in the base model as PEFT saw it when it matched
    the config's patterns ("model.layers.1.self_attn.q_proj"), from the tensors' keys."""
    names = {}
    for key in tensors:
        m = _PEFT_KEY.fullmatch(key)
        if m is not None and m.group(3) == "A":
            names[(int(m.group(1)), m.group(2))] = key[: key.index(".lora_A")].removeprefix(
                "base_model.model."
            )
    return names


def _pattern_value(patterns: dict, name: str, default: float) -> float:
    """PEFT's alpha_pattern: the first key that matches the end of the module's name (whole
    dotted parts; a key is a regular expression) overrides."""
    for key, value in patterns.items():
        try:
            found = re.match(rf"(.*\.)?({key})$", name)
        except re.error as e:
            raise ValueError(f"alpha_pattern: {key!r} is not a regular expression ({e})") from None
        if found:
            return float(value)
    return default


def _pairs(tensors: dict, pattern: re.Pattern, letters: str, module_of) -> dict:
    """(layer, module) -> (A, B) from the adapter's tensors; anything else is refused."""
    found: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        m = pattern.fullmatch(key)
        module = module_of(m.group(2)) if m else None
        if m is None or module not in LORA_MODULES:
            raise ValueError(
                f"target_modules: {key!r} is not supported (LoRA on {', '.join(LORA_MODULES)})"
            )
        found.setdefault((int(m.group(1)), module), {})[m.group(3).upper()] = value
    pairs = {}
    for (layer, module), ab in found.items():
        if set(ab) != {"A", "B"}:
            raise ValueError(
                f"layers.{layer}.{module}: lora_{letters[0]} or lora_{letters[1]} missing"
            )
        a, b = ab["A"], ab["B"]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise ValueError(
                f"layers.{layer}.{module}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} "
                "do not make a low-rank pair"
            )
        pairs[(layer, module)] = (a, b)
    if not pairs:
        raise ValueError("the adapter holds no LoRA weights")
    return pairs


def _load_gguf_lora(name: str, path: Path) -> LoRAAdapter:
    """llama.cpp's GGUF LoRA: general.type "adapter", adapter.type "lora",
    adapter.lora.alpha; tensors blk.N.<module>.weight.lora_a [r, in] / .lora_b [out, r],
    q/k rows in llama.cpp's order for the "llama" architecture (undone here)."""
    from tokenmill.model.gguf_file import GGUFFile
    from tokenmill.model.gguf_layout import rope_permuted, unpermute_rope_weight
    from tokenmill.model.loader import dequantize_tensor

    gguf = GGUFFile(path)
    meta = gguf.metadata
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise ValueError(f"{path.name}: not a GGUF LoRA adapter (general.type / adapter.type)")
    tensors = {
        t.name: torch.from_numpy(np.ascontiguousarray(dequantize_tensor(t))) for t in gguf.tensors
    }
    pairs = _pairs(tensors, _GGUF_KEY, "ab", _GGUF_MODULES.get)
    rank = next(iter(pairs.values()))[0].shape[0]
    alpha = float(meta.get("adapter.lora.alpha", rank))
    arch = str(meta.get("general.architecture", "llama"))
    heads = {"q_proj": meta.get(f"{arch}.attention.head_count"),
             "k_proj": meta.get(f"{arch}.attention.head_count_kv")}  # fmt: skip
    deltas = {}
    for (layer, module), (a, b) in pairs.items():
        b = b.float()
        if module in heads and rope_permuted(arch):
            if not heads[module]:
                raise ValueError(f"{arch}.attention.head_count: missing (q/k rows cannot be read)")
            b = torch.from_numpy(unpermute_rope_weight(b.numpy(), int(heads[module])).copy())
        deltas[(layer, module)] = (a.float().contiguous(), (b * (alpha / a.shape[0])).contiguous())
    return LoRAAdapter(name, str(path), deltas)


def check_lora(
    adapter: LoRAAdapter, shapes: dict[str, tuple[int, int]], num_layers: int, max_rank: int
) -> None:
    """ValueError when the adapter does not fit the base (`shapes`: module -> (in, out))
    or its rank is above the server's --max-lora-rank."""
    if adapter.rank > max_rank:
        raise ValueError(
            f"max_lora_rank: adapter {adapter.name!r} has rank {adapter.rank}, above this "
            f"server's --max-lora-rank {max_rank}"
        )
    for (layer, module), (a, b) in adapter.deltas.items():
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            raise ValueError(
                f"adapter {adapter.name!r}: layers.{layer}.{module} holds NaN or infinite weights"
            )
        if layer >= num_layers:
            raise ValueError(
                f"base_model: adapter {adapter.name!r} has layer {layer}; the base has {num_layers}"
            )
        want_in, want_out = shapes[module]
        if a.shape[1] != want_in or b.shape[0] != want_out:
            raise ValueError(
                f"base_model: adapter {adapter.name!r} is for another base: layers.{layer}."
                f"{module} is {a.shape[1]} -> {b.shape[0]}, the base's {want_in} -> {want_out}"
            )
