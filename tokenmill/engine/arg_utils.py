"""Engine arguments in one place: the command-line flags every engine-running command shares
(`serve`, `generate`, `chat`, `cluster`) and the frozen EngineConfig they build."""

from __future__ import annotations

import argparse

from tokenmill.config import (
    DRAFT_POLICIES,
    KV_CARRIERS,
    KV_LOAD_FAILURE_POLICIES,
    KV_ROLES,
    SPECULATIVE_METHODS,
    WEIGHT_FORMATS,
    CacheConfig,
    EngineConfig,
    GiB,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    default_num_threads,
)

# A prefill worker's per-prompt share of a step (--long-prefill-token-threshold's default for
# --role prefill): a short prompt arriving during an 8k one waits one ~0.6 s step on one
# thread of this CPU instead of the long prompt's whole prefill (benchmarks/disagg.py)
PREFILL_ROLE_CHUNK = 256


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument(
        "--model",
        default=None,
        help="GGUF file or HF folder (default: embedded SmolLM2-135M-Instruct)",
    )
    g.add_argument(
        "--weights",
        choices=list(WEIGHT_FORMATS),
        default=None,
        help="how weights run: native (the default: the file's GGUF blocks kept packed and "
        "run by native kernels; float files run as float32), float32 (dequantized), "
        "bfloat16, int8 (W8A8), or a GGUF format made at load (q8_0, q5_1, q5_0, q4_1, "
        "q4_0; also from safetensors)",
    )
    g.add_argument(
        "--quant-plan",
        default=None,
        metavar="FILE",
        help="a plan from `tokenmill quant search`: scheme, per-group formats, calibration",
    )
    g.add_argument(
        "--calibration",
        default=None,
        metavar="TEXT",
        help="calibrate the int8 / q* schemes made at load (AWQ / SmoothQuant scales) on "
        "'builtin' (the packaged text) or a text file",
    )
    g.add_argument(
        "--outlier-channels",
        type=int,
        default=0,
        metavar="N",
        help="with --calibration: keep the N most active input channels of each layer in "
        "float32 (the packed formats made at load)",
    )
    g.add_argument(
        "--dequant-cache",
        type=float,
        default=2.0,
        metavar="GIB",
        help="native weights: float32 copies kept for batched GEMMs (prefill, many "
        "sequences), up to GIB; decode reads the packed weights. 0: dequantize per call",
    )
    g.add_argument(
        "--max-kld",
        type=float,
        default=None,
        metavar="X",
        help="measure the weights' KL divergence from float32 at load (cached) and refuse "
        "to start above X",
    )
    g.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="older spelling of --weights float32|bfloat16",
    )
    g.add_argument(
        "--quantization", choices=["int8"], default=None, help="older spelling of --weights int8"
    )
    g.add_argument(
        "--max-model-len", type=int, default=None, help="context length (default: the model's)"
    )
    g.add_argument(
        "--kv-cache-memory", type=float, default=2.0, metavar="GIB", help="KV cache budget in GiB"
    )
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    g.add_argument("--max-num-seqs", type=int, default=128, help="sequences per step")
    g.add_argument("--max-num-batched-tokens", type=int, default=2048, help="token budget per step")
    g.add_argument("--no-chunked-prefill", action="store_true", help="schedule whole prompts only")
    g.add_argument(
        "--long-prefill-token-threshold",
        type=int,
        default=None,
        metavar="N",
        help="a prompt takes at most N tokens of a step, so later prompts run beside a long "
        f"one (0: off; default: {PREFILL_ROLE_CHUNK} on a --role prefill worker, else off)",
    )
    g.add_argument("--scheduling-policy", choices=["fcfs", "priority"], default="fcfs")
    g.add_argument(
        "--num-threads", type=int, default=None, help="torch threads (default: all cores)"
    )
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    g.add_argument(
        "--kv-offload-memory",
        type=float,
        default=0.0,
        metavar="GIB",
        help="host-memory tier for evicted KV blocks",
    )
    g.add_argument(
        "--kv-offload-disk",
        type=float,
        default=0.0,
        metavar="GIB",
        help="disk tier for evicted KV blocks",
    )
    g.add_argument(
        "--kv-offload-path",
        default=None,
        help="disk tier directory (default ~/.cache/tokenmill/kv)",
    )
    g.add_argument(
        "--kv-events-endpoint",
        default=None,
        help="ZMQ PUB endpoint for KV events, e.g. tcp://*:5557",
    )
    g.add_argument(
        "--kv-events-replay-endpoint", default=None, help="ZMQ ROUTER endpoint for event replay"
    )
    g.add_argument(
        "--speculative",
        choices=list(SPECULATIVE_METHODS),
        default=None,
        help="speculative decoding: ngram (prompt lookup: drafts copied from earlier in the "
        "sequence, verified in one step) or draft_head (with --speculator)",
    )
    g.add_argument(
        "--speculator",
        default=None,
        metavar="FILE",
        help="a draft head trained for this model (`tokenmill speculator train`); implies "
        "--speculative draft_head",
    )
    g.add_argument(
        "--num-speculative-tokens", type=int, default=4, metavar="K", help="drafts per step"
    )
    g.add_argument(
        "--speculative-draft-policy",
        choices=list(DRAFT_POLICIES),
        default="auto",
        help="auto: drafts sized per request and step by measured step times and acceptance "
        "(none where they would not pay); fixed: every draft the proposer finds",
    )
    g.add_argument(
        "--speculative-lookup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with a draft head: try n-gram lookup first (free; where the sequence repeats "
        "itself), the head where it finds nothing",
    )
    g.add_argument(
        "--record-traffic",
        default=None,
        metavar="DIR",
        help="write every completed request's prompt and output (text and token ids) as JSONL "
        "to DIR, to train a draft head on (`tokenmill speculator train --traces DIR`). This "
        "stores user data; off by default",
    )
    g.add_argument(
        "--no-warm-up",
        dest="warm_up",
        action="store_false",
        help="skip the short request run through the model before serving (the first "
        "request then pays first-call costs; benchmarks/cold_start.py measures both)",
    )
    g.add_argument(
        "--record-traffic-max-mib",
        type=int,
        default=256,
        metavar="MIB",
        help="stop recording once this much is written",
    )
    g.add_argument(
        "--ngram-min", type=int, default=2, metavar="N", help="shortest suffix n-gram looked up"
    )
    g.add_argument(
        "--ngram-max", type=int, default=5, metavar="N", help="longest suffix n-gram looked up"
    )


def add_kv_transfer_args(p: argparse.ArgumentParser) -> None:
    """`serve` only: this replica's part in prefill/decode disaggregation."""
    g = p.add_argument_group("prefill/decode disaggregation")
    g.add_argument(
        "--role",
        choices=KV_ROLES,
        default="both",
        help="prefill: serve the KV blocks of requests the router marks do_remote_decode; "
        "decode: load the prompt's KV from a prefill worker for requests marked "
        "do_remote_prefill; both: neither (a plain replica)",
    )
    g.add_argument(
        "--kv-transfer-endpoint",
        default="tcp://127.0.0.1:0",
        metavar="ENDPOINT",
        help="prefill worker: where its KV block server binds (port 0: any free port; the "
        "address is reported in /server_info). Bind a reachable address across hosts",
    )
    g.add_argument(
        "--kv-transfer-carrier",
        choices=KV_CARRIERS,
        default="auto",
        help="decode worker: shm (shared memory, same host), tcp, or auto (shm when the "
        "prefill worker is on this host)",
    )
    g.add_argument(
        "--kv-lease-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="prefill worker: blocks held for a decode worker at most this long",
    )
    g.add_argument(
        "--kv-transfer-timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="decode worker: a KV load taking longer fails",
    )
    g.add_argument(
        "--kv-load-failure-policy",
        choices=KV_LOAD_FAILURE_POLICIES,
        default="recompute",
        help="decode worker, when a KV load fails: recompute the prompt here, or fail the request",
    )  # fmt: skip


def kv_transfer_config(args: argparse.Namespace) -> KVTransferConfig:
    return KVTransferConfig(
        role=args.role,
        endpoint=args.kv_transfer_endpoint,
        carrier=args.kv_transfer_carrier,
        lease_timeout_s=args.kv_lease_timeout,
        transfer_timeout_s=args.kv_transfer_timeout,
        load_failure_policy=args.kv_load_failure_policy,
    )


def engine_kwargs(args: argparse.Namespace) -> dict:
    return dict(
        kv_transfer_config=kv_transfer_config(args) if hasattr(args, "role") else None,
        dtype=args.dtype,
        quantization=args.quantization,
        weights=args.weights,
        quant_plan=args.quant_plan,
        calibration=args.calibration,
        outlier_channels=args.outlier_channels,
        dequant_cache_gib=args.dequant_cache,
        max_kld=args.max_kld,
        max_model_len=args.max_model_len,
        kv_cache_memory_gib=args.kv_cache_memory,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_chunked_prefill=not args.no_chunked_prefill,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        scheduling_policy=args.scheduling_policy,
        num_threads=args.num_threads,
        seed=args.seed,
        enable_prefix_caching=not args.no_prefix_caching,
        kv_offload_memory_gib=args.kv_offload_memory,
        kv_offload_disk_gib=args.kv_offload_disk,
        kv_offload_path=args.kv_offload_path,
        kv_events_endpoint=args.kv_events_endpoint,
        kv_events_replay_endpoint=args.kv_events_replay_endpoint,
        speculative=args.speculative,
        num_speculative_tokens=args.num_speculative_tokens,
        ngram_min=args.ngram_min,
        ngram_max=args.ngram_max,
        speculative_draft_policy=args.speculative_draft_policy,
        speculator=args.speculator,
        speculative_lookup=args.speculative_lookup,
        record_traffic=args.record_traffic,
        record_traffic_max_mib=args.record_traffic_max_mib,
        warm_up=args.warm_up,
    )


def build_engine_config(
    model: str | None = None,
    *,
    dtype: str = "float32",
    quantization: str | None = None,
    weights: str | None = None,
    quant_plan: str | None = None,
    calibration: str | None = None,
    outlier_channels: int = 0,
    dequant_cache_gib: float = 2.0,
    max_kld: float | None = None,
    max_model_len: int | None = None,
    seed: int = 0,
    block_size: int = 16,
    kv_cache_memory_gib: float = 2.0,
    num_kv_blocks: int | None = None,
    max_num_seqs: int = 128,
    max_num_batched_tokens: int = 2048,
    enable_chunked_prefill: bool = True,
    long_prefill_token_threshold: int | None = None,
    scheduling_policy: str = "fcfs",
    max_waiting_requests: int | None = None,
    num_threads: int | None = None,
    enable_prefix_caching: bool = True,
    kv_offload_memory_gib: float = 0.0,
    kv_offload_disk_gib: float = 0.0,
    kv_offload_path: str | None = None,
    kv_events_endpoint: str | None = None,
    kv_events_replay_endpoint: str | None = None,
    speculative: str | None = None,
    num_speculative_tokens: int = 4,
    ngram_min: int = 2,
    ngram_max: int = 5,
    speculative_draft_policy: str = "auto",
    speculator: str | None = None,
    speculative_lookup: bool = True,
    record_traffic: str | None = None,
    record_traffic_max_mib: int = 256,
    warm_up: bool = True,
    kv_transfer_config: KVTransferConfig | None = None,
) -> EngineConfig:
    if record_traffic_max_mib < 1:
        raise ValueError("record-traffic-max-mib: must be >= 1")
    if speculator is not None and speculative is None:
        speculative = "draft_head"
    kv_transfer_config = kv_transfer_config or KVTransferConfig()
    if long_prefill_token_threshold is None:
        prefill_role = kv_transfer_config.role == "prefill"
        long_prefill_token_threshold = PREFILL_ROLE_CHUNK if prefill_role else 0
    return EngineConfig(
        model_config=ModelConfig(
            model=model,
            dtype=dtype,
            quantization=quantization,
            max_model_len=max_model_len,
            seed=seed,
            weights=weights,
            quant_plan=quant_plan,
            calibration=calibration,
            outlier_channels=outlier_channels,
            dequant_cache_bytes=int(dequant_cache_gib * GiB),
            max_kld=max_kld,
        ),
        cache_config=CacheConfig(
            block_size,
            int(kv_cache_memory_gib * GiB),
            num_kv_blocks,
            enable_prefix_caching,
            int(kv_offload_memory_gib * GiB),
            int(kv_offload_disk_gib * GiB),
            kv_offload_path,
            kv_events_endpoint,
            kv_events_replay_endpoint,
        ),
        scheduler_config=SchedulerConfig(
            max_num_seqs,
            max_num_batched_tokens,
            enable_chunked_prefill,
            scheduling_policy,
            max_waiting_requests,
            long_prefill_token_threshold,
        ),
        num_threads=num_threads or default_num_threads(),
        record_traffic_dir=record_traffic,
        record_traffic_max_bytes=record_traffic_max_mib << 20,
        warm_up=warm_up,
        kv_transfer_config=kv_transfer_config,
        speculative_config=(
            SpeculativeConfig(
                speculative,
                num_speculative_tokens,
                ngram_min,
                ngram_max,
                speculative_draft_policy,
                speculator,
                speculative_lookup,
            )
            if speculative
            else None
        ),
    )
