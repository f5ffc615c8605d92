"""The GPU run's environment probe and the card's two ceilings, measured: device-to-device
copy bandwidth (bytes read + written) and a bf16 matrix product on random data."""

from __future__ import annotations

import argparse
import json
import platform

import torch
import triton


def _median_ms(fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    src = torch.randn(1 << 30, dtype=torch.bfloat16, device="cuda")  # 2 GiB
    dst = torch.empty_like(src)
    copy_ms = _median_ms(lambda: dst.copy_(src))
    n = 8192
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    mm_ms = _median_ms(lambda: a @ b, reps=10)
    info = {
        "device": props.name,
        "multiprocessors": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "copy_tb_s": round(2 * src.numel() * 2 / (copy_ms / 1e3) / 1e12, 3),
        "bf16_matmul_tflop_s": round(2 * n**3 / (mm_ms / 1e3) / 1e12, 1),
    }
    print(json.dumps(info, indent=1))
    with open(args.out, "w") as f:
        json.dump(info, f, indent=1)


if __name__ == "__main__":
    main()
