"""Random LoRA adapters for the tiny Llama, written by PEFT (`save_pretrained`) and as
llama.cpp's convert_lora_to_gguf.py writes GGUF LoRA files, for parity tests against
PEFT's PeftModel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

# (name, rank, alpha, target modules): different ranks and targets
ADAPTERS = [
    ("sql", 4, 8, ["q_proj", "v_proj"]),
    ("poet", 8, 16, ["o_proj", "gate_proj", "down_proj"]),
    ("chat", 16, 8, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
]


def make_peft_adapter(
    base_dir: Path, out: Path, rank: int, alpha: int, targets, seed: int, **config
):
    """A PEFT LoRA folder with random A and B (B is zero at PEFT's default init: not here);
    `config`: more LoraConfig fields (alpha_pattern, rank_pattern, use_rslora, ...)."""
    import transformers
    from peft import LoraConfig, get_peft_model

    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir).float()
    torch.manual_seed(seed)
    config = LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=list(targets), init_lora_weights=False,
        lora_dropout=0.0, bias="none", task_type="CAUSAL_LM", **config,
    )  # fmt: skip
    model = get_peft_model(base, config)
    with torch.no_grad():  # deltas big enough to move the logits, small enough to stay sane
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(0.5)
    model.save_pretrained(out, safe_serialization=True)
    return out


def make_peft_adapters(base_dir: Path, root: Path) -> dict[str, Path]:
    """The ADAPTERS as PEFT folders under root: name -> folder."""
    return {
        name: make_peft_adapter(base_dir, root / name, rank, alpha, targets, seed=i)
        for i, (name, rank, alpha, targets) in enumerate(ADAPTERS)
    }


def write_gguf_lora(peft_dir: Path, out: Path, num_heads: int, num_kv_heads: int) -> Path:
    """The same adapter as llama.cpp's convert_lora_to_gguf.py writes it: general.type
    "adapter", adapter.type "lora", adapter.lora.alpha; blk.N.<tensor>.weight.lora_a/_b,
    the lora_b rows of q/k permuted as llama.cpp permutes the base's q/k weights."""
    import json

    import gguf
    from safetensors.torch import load_file

    config = json.loads((peft_dir / "adapter_config.json").read_text())
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}  # fmt: skip
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(config["lora_alpha"]))
    writer.add_head_count(num_heads)
    writer.add_head_count_kv(num_kv_heads)
    for key, value in sorted(load_file(str(peft_dir / "adapter_model.safetensors")).items()):
        parts = key.split(".")
        layer = parts[parts.index("layers") + 1]
        module = parts[parts.index("layers") + 3]
        ab = "lora_a" if ".lora_A." in key else "lora_b"
        data = value.float().numpy()
        if ab == "lora_b" and module in ("q_proj", "k_proj"):
            heads = num_heads if module == "q_proj" else num_kv_heads
            data = _permute(data, heads)
        writer.add_tensor(f"blk.{layer}.{names[module]}.weight.{ab}", np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute (convert_hf_to_gguf.py): rotate-half -> interleaved."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )
