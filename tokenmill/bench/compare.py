"""`--compare`: tokenmill (and optionally its int8 variant) and llama-server on one file.

Peers started here run one at a time on the same model file; llama-server gets
`-t THREADS -c CTX -np SLOTS -kvu` (one KV pool shared by the slots) with CTX raised to
fit SLOTS requests of the workload's largest size.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from tokenmill.bench.config import Target
from tokenmill.bench.peers import find_llama_server, llama_server_spec, tokenmill_spec
from tokenmill.bench.plan import Plan, max_request_tokens
from tokenmill.bench.session import Source

BUILD_HINT = "build it with benchmarks/peers/build_llama_cpp.sh or set TOKENMILL_LLAMA_CPP_BIN"


def default_model() -> str:
    from tokenmill.model.embedded import embedded_model_path

    return str(embedded_model_path())


def llama_ctx(requested: int, slots: int, per_request: int) -> int:
    """At least `requested`, and enough for every slot to hold its largest request."""
    need = slots * (per_request + 64)  # + chat template / BOS slack
    return max(requested, -(-need // 1024) * 1024)


def compare_sources(
    args: argparse.Namespace, plan: Plan, common: dict[str, Any]
) -> tuple[list[Source], str | None]:
    console = Console()
    model = args.model or default_model()
    sources = [
        Source(
            Target("tokenmill", "", **common),
            tokenmill_spec("tokenmill", model, args.tokenmill_args),
        )
    ]
    if args.int8:
        extra = f"{args.tokenmill_args} --quantization int8"
        sources.append(
            Source(
                Target("tokenmill-int8", "", **common),
                tokenmill_spec("tokenmill-int8", model, extra),
            )
        )
    if args.no_llama_server:
        return sources, None
    binary = find_llama_server() if args.llama_server_bin is None else None
    if args.llama_server_bin:
        from pathlib import Path

        binary = Path(args.llama_server_bin)
    if binary is None or not binary.is_file():
        console.print(f"[yellow]llama-server not found: skipping it ({BUILD_HINT})")
        return sources, None
    slots = args.llama_slots or max(1, min(plan.max_in_flight, 256))
    per_request = max(max_request_tokens(w) for w in plan.workloads)
    ctx = llama_ctx(args.llama_ctx, slots, per_request)
    spec = llama_server_spec(binary, model, slots, args.llama_threads, ctx, args.llama_args)
    sources.append(Source(Target("llama-server", "", **common), spec))
    return sources, "llama-server"
