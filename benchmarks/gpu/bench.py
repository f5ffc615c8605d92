"""The GPU benchmark: the Llama-3.1-8B shape with random weights (--load-format dummy), bf16
and FP8, next to Hugging Face transformers on the same card in the same run, and the
single-stream roofline from the card's measured copy bandwidth.

Cases: single-stream decode (tok/s after a 128-token prompt), prefill of 2,048 tokens,
256 users x (128 in + 128 out) and 64 users x (1,000 + 1,000), output tok/s.

    python benchmarks/gpu/bench.py --probe probe.json --out bench.json
    python benchmarks/gpu/bench.py --device cpu --config <small config folder> --quick  (smoke)
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

import torch

from tokenmill import LLM, SamplingParams

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "llama-3.1-8b"
VOCAB = 49152  # prompts drawn from the embedded tokenizer's ids


def _prompts(n: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, VOCAB, (n, length), generator=g).tolist()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed_generate(llm: LLM, prompts: list[list[int]], out_len: int, device: str) -> float:
    params = SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True)
    _sync(device)
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    _sync(device)
    assert all(len(o.outputs[0].token_ids) == out_len for o in outs)
    return time.perf_counter() - t0


def bench_tokenmill(config: Path, weights: str, device: str, cases: dict) -> dict:
    llm = LLM(str(config), load_format="dummy", device=device, weights=weights,
              max_model_len=4096, max_num_seqs=256, max_num_batched_tokens=8192)  # fmt: skip
    _timed_generate(llm, _prompts(4, 16, 0), 4, device)  # warm-up (Triton compiles)
    result = {}
    p = _prompts(1, cases["single_in"], 1)
    first = _timed_generate(llm, p, 1, device)
    full = _timed_generate(llm, p, cases["single_out"] + 1, device)
    result["single_stream_decode_tok_s"] = cases["single_out"] / (full - first)
    t = _timed_generate(llm, _prompts(1, cases["prefill"], 2), 1, device)
    result["prefill_tok_s"] = cases["prefill"] / t
    for name, (users, n_in, n_out) in cases["batches"].items():
        t = _timed_generate(llm, _prompts(users, n_in, 3), n_out, device)
        result[f"{name}_output_tok_s"] = users * n_out / t
    del llm
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return result


def bench_transformers(config: Path, device: str, cases: dict) -> dict:
    import transformers

    fields = json.loads((config / "config.json").read_text())
    hf_config = transformers.AutoConfig.for_model(**fields)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    model.eval()

    def generate(prompts: list[list[int]], n_out: int) -> float:
        ids = torch.tensor(prompts, device=device)
        _sync(device)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n_out, min_new_tokens=n_out, do_sample=False,
                                 pad_token_id=0)  # fmt: skip
        _sync(device)
        assert out.shape[1] == ids.shape[1] + n_out
        return time.perf_counter() - t0

    generate(_prompts(1, 16, 0), 2)  # warm-up
    result = {}
    p = _prompts(1, cases["single_in"], 1)
    n = cases["hf_single_out"]
    result["single_stream_decode_tok_s"] = n / (generate(p, n + 1) - generate(p, 1))
    ids = torch.tensor(_prompts(1, cases["prefill"], 2), device=device)
    with torch.no_grad():
        model(ids)
        _sync(device)
        t0 = time.perf_counter()
        model(ids)
        _sync(device)
    result["prefill_tok_s"] = cases["prefill"] / (time.perf_counter() - t0)
    users, n_in, n_out = cases["batches"]["users256_128_128"]
    result["users256_128_128_output_tok_s"] = (
        users * n_out / generate(_prompts(users, n_in, 3), n_out)
    )
    result["weight_bytes"] = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return result  # the model is freed with this frame (main collects)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--probe", type=Path, help="probe.py's JSON (the copy bandwidth)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke run)")
    parser.add_argument("--skip-transformers", action="store_true")
    args = parser.parse_args()
    if args.quick:
        cases = {
            "single_in": 16,
            "single_out": 8,
            "hf_single_out": 4,
            "prefill": 64,
            "batches": {"users256_128_128": (8, 8, 8), "users64_1000_1000": (4, 16, 16)},
        }
    else:
        cases = {"single_in": 128, "single_out": 256, "hf_single_out": 64, "prefill": 2048,
                 "batches": {"users256_128_128": (256, 128, 128),
                             "users64_1000_1000": (64, 1000, 1000)}}  # fmt: skip
    results: dict = {"cases": cases}
    for weights in ("bfloat16", "fp8"):
        results[f"tokenmill_{weights}"] = bench_tokenmill(args.config, weights, args.device, cases)
        print(weights, results[f"tokenmill_{weights}"], flush=True)
    if not args.skip_transformers:
        results["transformers_bfloat16"] = bench_transformers(args.config, args.device, cases)
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
        print("transformers", results["transformers_bfloat16"], flush=True)
    if args.probe and args.probe.exists():
        probe = json.loads(args.probe.read_text())
        results["probe"] = probe
        weight_bytes = results.get("transformers_bfloat16", {}).get("weight_bytes")
        if weight_bytes:
            results["roofline_bf16_tok_s"] = probe["copy_tb_s"] * 1e12 / weight_bytes
    table = render(results)
    print(table)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
        args.out.with_suffix(".md").write_text(table + "\n")


def render(results: dict) -> str:
    rows = [("single-stream decode, tok/s", "single_stream_decode_tok_s"),
            ("prefill 2,048 tokens, tok/s", "prefill_tok_s"),
            ("256 users x (128+128), output tok/s", "users256_128_128_output_tok_s"),
            ("64 users x (1,000+1,000), output tok/s", "users64_1000_1000_output_tok_s")]  # fmt: skip
    hf = results.get("transformers_bfloat16", {})
    lines = ["| case | tokenmill bf16 | tokenmill FP8 | transformers bf16 | bf16 / transformers |",
             "|---|---|---|---|---|"]  # fmt: skip
    for label, key in rows:
        bf16 = results["tokenmill_bfloat16"].get(key)
        fp8 = results["tokenmill_fp8"].get(key)
        ref = hf.get(key)
        ratio = f"{bf16 / ref:.2f}x" if bf16 and ref else "-"
        cells = [f"{v:,.0f}" if v else "-" for v in (bf16, fp8, ref)]
        lines.append(f"| {label} | {' | '.join(cells)} | {ratio} |")
    roof = results.get("roofline_bf16_tok_s")
    if roof:
        single = results["tokenmill_bfloat16"]["single_stream_decode_tok_s"]
        lines.append(f"\nbf16 single-stream roofline (measured copy bandwidth / weight bytes): "
                     f"{roof:,.0f} tok/s; tokenmill reaches {100 * single / roof:.0f}%")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main()
