"""Parity with transformers on the GPU: the same random weights in a 2-layer Llama-3.1-8B
shape and a Qwen2.5-7B shape (q/k/v bias, randomized), in fp32 and bf16: per position, the
logits' relative error and whether the top token agrees, for a 512-token prefill, the same
prompt in 64-token chunks over cached blocks, and 64 single-token decode steps.

    python benchmarks/gpu/parity.py --out parity.json        (a CUDA device)
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
SHAPES = {"llama-3.1-8b-2l": "llama-3.1-8b", "qwen2.5-7b-2l": "qwen2.5-7b"}


def hf_model(config_dir: Path, small: bool):
    import transformers

    fields = json.loads((config_dir / "config.json").read_text())
    # 2 layers and the embedded tokenizer's 49,152 ids; the rest of the shape as shipped
    fields.update(num_hidden_layers=2, vocab_size=49152)
    if small:
        fields.update(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=64)  # fmt: skip
    config = transformers.AutoConfig.for_model(**fields)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                if proj.bias is not None:
                    proj.bias.normal_(0, 0.5)
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
    args = parser.parse_args()
    prompt = torch.randint(0, 49152, (512,), generator=torch.Generator().manual_seed(1)).tolist()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, config in SHAPES.items():
            model = hf_model(CONFIGS / config, args.small)
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
