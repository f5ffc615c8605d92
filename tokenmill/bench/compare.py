"""`--compare`: tokenmill (and optionally variants of it: int8, bfloat16, any serve flags) and
llama-server on one file (and optionally llama-server on other files, e.g. an F16 GGUF).

Peers started here run one at a time; llama-server gets
`-t THREADS -c CTX -np SLOTS -kvu` (one KV pool shared by the slots) with CTX raised to
fit SLOTS requests of the workload's largest size.
"""

from __future__ import annotations

import argparse
from typing import Any

from tokenmill.bench.config import Target
from tokenmill.bench.peers import find_llama_server, llama_server_spec, tokenmill_spec
from tokenmill.bench.plan import Plan, max_request_tokens
from tokenmill.bench.session import Source
from tokenmill.console import OutputConsole

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
    console = OutputConsole()
    model = args.model or default_model()
    sources = [
        Source(
            Target("tokenmill", "", **common),
            tokenmill_spec("tokenmill", model, args.tokenmill_args),
        )
    ]
    variants = list(args.variant)
    if args.bf16:
        variants.append("tokenmill-bf16=--dtype bfloat16")
    if args.int8:
        variants.append("tokenmill-int8=--quantization int8")
    for name, flags in (split_named(v, "--variant") for v in variants):
        extra = f"{args.tokenmill_args} {flags}"
        sources.append(Source(Target(name, "", **common), tokenmill_spec(name, model, extra)))
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
    for name, path in (split_named(m, "--llama-model") for m in args.llama_model):
        spec = llama_server_spec(binary, path, slots, args.llama_threads, ctx, args.llama_args)
        sources.append(Source(Target(name, "", **common), spec))
    return sources, "llama-server"


def split_named(value: str, flag: str) -> tuple[str, str]:
    """NAME=VALUE from a repeatable flag."""
    name, sep, rest = value.partition("=")
    if not sep or not name.strip() or not rest.strip():
        raise ValueError(f"{flag}: expected NAME=VALUE, got {value!r}")
    return name.strip(), rest.strip()
