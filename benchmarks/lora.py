"""Multi-LoRA throughput: 32 users spread over 8 adapters against 32 users on the base alone,
and against the naive per-request loop, in the same run on the same engine.

The base is the embedded SmolLM2-135M (its GGUF blocks run packed by the native kernels:
the deltas run beside the packed weights). Eight random rank-16 adapters on every decoder
module (q/k/v/o, gate/up/down) are written as PEFT folders. Each configuration runs 32
greedy requests of 128 output tokens (prompts of ~40 tokens) through one offline engine
(max_num_seqs 32), best of --reps; the table gives output tok/s and the ratio to the base.

    python benchmarks/lora.py [--reps 2] [--users 32] [--adapters 8] [--rank 16]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

from benchmarks import results as results_file  # noqa: E402
from tokenmill import LLM, SamplingParams  # noqa: E402
from tokenmill.model.model_files import read_model_info  # noqa: E402

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TOPICS = ["SQL queries", "poetry", "customer support", "legal summaries", "recipes",
          "medical notes", "code review", "travel plans"]  # fmt: skip


def write_adapter(folder: Path, arch, rank: int, seed: int) -> Path:
    """A PEFT LoRA folder with random weights for the base's shapes."""
    from safetensors.torch import save_file

    h, q, kv, inter = arch.hidden_size, arch.q_size, arch.kv_size, arch.intermediate_size
    shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
              "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(arch.num_hidden_layers):
        for module in MODULES:
            part = "self_attn" if module in MODULES[:4] else "mlp"
            key = f"base_model.model.model.layers.{layer}.{part}.{module}"
            fan_in, fan_out = shapes[module]
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, fan_in, generator=gen) / fan_in**0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(fan_out, rank, generator=gen) * 0.01
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
              "target_modules": list(MODULES), "bias": "none"}  # fmt: skip
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def run(
    llm: LLM, prompts: list[str], loras: list[str | None], max_tokens: int
) -> tuple[float, float]:
    """Output tokens per second of one batch of requests: per wall-clock second and per
    CPU second of this process (the engine runs in it; on a shared machine the CPU time
    is the steadier measure of the work)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    t0, c0 = time.perf_counter(), time.process_time()
    outs = llm.generate(prompts, params, lora_name=loras)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return tokens / wall, tokens / cpu


def fused_decode(llm: LLM, on: bool) -> None:
    """The native one-call decoder on or off (a step with adapter rows never takes it: the
    "layer by layer" row shows what that alone costs the base)."""
    model = llm.engine.core.model
    model.method.fused_decode = on and llm.engine.core.kernel_config.fused_decode
    model._fused_checked_for = None  # decided again at the next step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--users", type=int, default=32)
    p.add_argument("--adapters", type=int, default=8)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    results_file.add_arguments(p)
    args = p.parse_args()

    arch = read_model_info(None).arch
    tmp = Path(tempfile.mkdtemp(prefix="lora-bench-"))
    names = [f"lora{i}" for i in range(args.adapters)]
    specs = tuple(f"{n}={write_adapter(tmp / n, arch, args.rank, i)}" for i, n in enumerate(names))
    llm = LLM(
        None, lora_modules=specs, max_loras=args.adapters, max_lora_rank=args.rank,
        max_num_seqs=args.users, kv_cache_memory_gib=1.0,
        **({"num_threads": args.threads} if args.threads else {}),
    )  # fmt: skip
    prompts = [
        f"User {i} asks about {TOPICS[i % len(TOPICS)]}: write a detailed answer with examples, "
        "step by step, covering the main points and the common mistakes."
        for i in range(args.users)
    ]
    spread = [names[i % len(names)] for i in range(args.users)]
    lora = llm.engine.core.runner.lora
    runs = {
        "base only": ([None] * args.users, "batched"),
        "base only, layer by layer": ([None] * args.users, "layers"),
        f"{args.adapters} adapters, batched": (spread, "batched"),
        f"{args.adapters} adapters, per-request loop": (spread, "per_request"),
    }
    run(llm, prompts[:4], [None, *spread[:3]], 8)  # warm-up
    best: dict[str, tuple[float, float]] = {}
    for _ in range(args.reps):
        for label, (loras, mode) in runs.items():
            lora.mode = "batched" if mode == "layers" else mode
            fused_decode(llm, mode != "layers")
            wall, cpu = run(llm, prompts, loras, args.max_tokens)
            old = best.get(label, (0.0, 0.0))
            best[label] = (max(old[0], wall), max(old[1], cpu))
    lora.mode = "batched"
    base = best["base only"]
    rows = [
        [label, f"{w:.1f}", f"{w / base[0]:.2f}x", f"{c:.1f}", f"{c / base[1]:.2f}x"]
        for label, (w, c) in best.items()
    ]
    per_request = best[f"{args.adapters} adapters, per-request loop"][1]
    batched = best[f"{args.adapters} adapters, batched"][1]
    headers = ["configuration", "out tok/s (wall)", "vs base", "out tok per CPU-s", "vs base"]
    table = results_file.markdown_table(headers, rows)
    print(table)
    print(f"\nbatched vs per-request loop (CPU time): {batched / per_request:.2f}x")
    results_file.write(
        "lora", table, args, title="Multi-LoRA throughput (SmolLM2-135M, native packed base)",
        notes=[
            f"{args.users} users, {args.max_tokens} output tokens each (greedy, ignore_eos), "
            f"{args.adapters} random rank-{args.rank} adapters on q/k/v/o/gate/up/down, "
            f"best of {args.reps}; one offline engine, max_num_seqs {args.users}.",
            f"batched vs per-request loop (CPU time): {batched / per_request:.2f}x.",
            f"adapter weights: {lora.weight_dtype} ("
            + ("the C kernel: one call per layer for the step's adapters; the per-request "
               "loop calls it once per request" if lora.kernel else "torch matmuls")
            + ").",
        ],
    )  # fmt: skip


if __name__ == "__main__":
    main()
