"""--load-format dummy (vLLM's name): random weights of the shapes a config.json describes,
for benchmarks of real model shapes with nothing downloaded.

The names and shapes come from transformers' own model class for the config, built on the
meta device (no memory), so every family transformers knows gets exactly its checkpoint's
tensors. Values: normal(0, initializer_range) for matrices and embeddings, ones for norm
weights, zeros for biases; made on `device` in `dtype` (an 8B model in bf16 never passes
through host memory)."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def checkpoint_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of a Hugging Face checkpoint of this config (its state dict)."""
    try:
        import transformers
    except ImportError as e:
        raise ValueError(
            "load_format: dummy needs transformers for the checkpoint's shapes "
            "(pip install 'tokenmill[bench]')"
        ) from e
    hf_config = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if getattr(hf_config, "tie_word_embeddings", False):
        shapes.pop("lm_head.weight", None)
    return shapes


def dummy_weights(
    folder: Path, device: str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0
) -> dict[str, torch.Tensor]:
    config = json.loads((folder / "config.json").read_text())
    std = float(config.get("initializer_range", 0.02))
    gen = torch.Generator(device=device).manual_seed(seed)
    weights: dict[str, torch.Tensor] = {}
    for name, shape in checkpoint_shapes(config).items():
        if name.endswith("inv_freq"):
            continue
        if name.endswith("bias"):
            weights[name] = torch.zeros(shape, dtype=dtype, device=device)
        elif len(shape) == 1:  # norm weights
            weights[name] = torch.ones(shape, dtype=dtype, device=device)
        else:
            t = torch.empty(shape, dtype=dtype, device=device)
            weights[name] = t.normal_(0.0, std, generator=gen)
    return weights
