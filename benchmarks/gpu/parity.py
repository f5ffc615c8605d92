"""Parity with transformers on the GPU, on the same random weights in 2-layer model shapes.

Shapes: Llama-3.1-8B, Qwen2.5-7B (q/k/v bias, randomized), Qwen3-0.6B (q/k norms) and Qwen3-30B-A3B
(mixture of experts, 32 of its 128 experts), norm weights randomized, in fp32 and bf16: per
position, the logits' relative error and whether the top token agrees, for a 512-token
prefill, the same prompt in 64-token chunks over cached blocks, and 64 single-token decode
steps.

    python benchmarks/gpu/parity.py --out parity.json        (a CUDA device)
    python benchmarks/gpu/parity.py --shapes qwen3-0.6b-2l   (some of the shapes)
    python benchmarks/gpu/parity.py --device cpu --small     (a smoke run of this script)
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
from pathlib import Path

import torch

from tests.tiny_models import save_hf_folder
from tokenmill import LLM
from tokenmill.engine.scoring import sequence_logits

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# name -> (shipped config, changes besides 2 layers and the embedded tokenizer's 49,152 ids)
SHAPES = {
    "llama-3.1-8b-2l": ("llama-3.1-8b", {}),
    "qwen2.5-7b-2l": ("qwen2.5-7b", {}),
    "qwen3-0.6b-2l": ("qwen3-0.6b", {}),
    "qwen3-30b-a3b-2l-32e": ("qwen3-30b-a3b", {"num_experts": 32}),  # built in seconds
}
_SMALL = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
              num_key_value_heads=2, head_dim=64, moe_intermediate_size=128)  # fmt: skip


def hf_model(config_dir: Path, changes: dict, small: bool):
    import transformers

    fields = json.loads((config_dir / "config.json").read_text())
    fields.update(num_hidden_layers=2, vocab_size=49152, **changes)
    if small:
        fields.update({k: v for k, v in _SMALL.items() if k in fields or k == "head_dim"})
    config = transformers.AutoConfig.for_model(**fields)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("_proj.bias"):  # q/k/v biases (Qwen2)
                p.normal_(0, 0.5)
            elif name.endswith("norm.weight"):  # every norm's scale, q/k norms included
                p.add_(torch.randn_like(p) * 0.2)
    return model.eval()


def compare(ours: torch.Tensor, ref: torch.Tensor) -> dict:
    ours, ref = ours.float().cpu(), ref.float().cpu()
    rel = (ours - ref).norm(dim=1) / ref.norm(dim=1)
    return {
        "positions": ref.shape[0],
        "rel_err_max": float(f"{rel.max().item():.3e}"),
        "rel_err_median": float(f"{rel.median().item():.3e}"),
        "top1_agree_pct": round(100 * (ours.argmax(1) == ref.argmax(1)).float().mean().item(), 2),
    }


def run_shape(name: str, model, folder: Path, device: str, prompt: list[int]) -> list[dict]:
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        with torch.no_grad():
            ref = model.to(device, dtype)(torch.tensor([prompt], device=device)).logits[0]
        weights = "float32" if dtype == torch.float32 else "bfloat16"
        llm = LLM(str(folder), device=device, weights=weights, num_kv_blocks=256,
                  max_num_batched_tokens=1024)  # fmt: skip
        core = llm.engine.core
        for path, chunk, n in (("prefill", None, len(prompt)), ("chunks of 64", 64, len(prompt)),
                               ("decode steps", 1, 64)):  # fmt: skip
            ours = sequence_logits(core, prompt[:n], chunk_size=chunk)
            row = {"shape": name, "dtype": weights, "path": path, **compare(ours, ref[:n])}
            rows.append(row)
            print(row, flush=True)
        del llm, core
        gc.collect()
        torch.cuda.empty_cache() if device == "cuda" else None
    model.to("cpu", torch.float32)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--out", default=None)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="small hidden sizes (smoke run)")
    parser.add_argument("--shapes", nargs="*", choices=list(SHAPES), help="default: all")
    args = parser.parse_args()
    prompt = torch.randint(0, 49152, (512,), generator=torch.Generator().manual_seed(1)).tolist()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (config, changes) in SHAPES.items():
            if args.shapes and name not in args.shapes:
                continue
            model = hf_model(CONFIGS / config, changes, args.small)
            folder = save_hf_folder(model, Path(tmp) / name)
            rows += run_shape(name, model, folder, args.device, prompt)
            del model
            gc.collect()
    lines = ["| shape | dtype | path | positions | rel. error max / median | top-1 agree |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['dtype']} | {r['path']} | {r['positions']} | "
            f"{r['rel_err_max']:.2e} / {r['rel_err_median']:.2e} | {r['top1_agree_pct']}% |"
        )
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
