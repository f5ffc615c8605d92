"""Engine arguments in one place (vLLM's EngineArgs): each field's default, type, help and
flag. The flags of every engine-running command (`serve`, `generate`, `chat`, `batch`,
`cluster`), the keys of `--config FILE`, the keywords of `LLM(...)` and the frozen
EngineConfig (`create_engine_config()`) all come from these fields."""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from tokenmill import envs
from tokenmill.config import (
    ATTENTION_BACKENDS,
    DRAFT_POLICIES,
    DTYPES,
    KV_CACHE_DTYPES,
    KV_CARRIERS,
    KV_LOAD_FAILURE_POLICIES,
    KV_ROLES,
    LOAD_FORMATS,
    LORA_DTYPES,
    QUANTIZATIONS,
    SCHEDULING_POLICIES,
    SPECULATIVE_METHODS,
    WEIGHT_FORMATS,
    CacheConfig,
    EngineConfig,
    KernelConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from tokenmill.engine.arg_spec import (
    ENGINE,
    GIB,
    KERNELS,
    KV_TRANSFER,
    MIB,
    add_arguments,
    cli_fields,
    config_default,
    namespace_values,
    option,
)
from tokenmill.platform import DEVICES

# A prefill worker's per-prompt share of a step (--long-prefill-token-threshold's default for
# --role prefill): a short prompt arriving during an 8k one waits one ~0.6 s step on one
# thread of this CPU instead of the long prompt's whole prefill (benchmarks/disagg.py)
PREFILL_ROLE_CHUNK = 256
GROUP_TITLES = {
    KERNELS: "kernels (A/B switches for benchmarks; their $TOKENMILL_* variable is the default)"
}

M, C, S = "model_config.", "cache_config.", "scheduler_config."
SP, KV, K = "speculative_config.", "kv_transfer_config.", "kernel_config."


@dataclass
class EngineArgs:
    model: str | None = option(
        M + "model", "GGUF file or HF folder (default: embedded SmolLM2-135M-Instruct)"
    )
    weights: str | None = option(
        M + "weights", "how weights run: native (the default: the file's GGUF blocks kept "
        "packed and run by native kernels; float files run as float32), float32 (dequantized), "
        "bfloat16, int8 (W8A8), or a GGUF format made at load (q8_0, q5_1, q5_0, q4_1, "
        "q4_0; also from safetensors)", choices=WEIGHT_FORMATS,
    )  # fmt: skip
    quant_plan: str | None = option(
        M + "quant_plan", "a plan from `tokenmill quant search`: scheme, per-group formats, "
        "calibration", metavar="FILE",
    )  # fmt: skip
    calibration: str | None = option(
        M + "calibration", "calibrate the int8 / q* schemes made at load (AWQ / SmoothQuant "
        "scales) on 'builtin' (the packaged text) or a text file", metavar="TEXT",
    )  # fmt: skip
    outlier_channels: int = option(
        M + "outlier_channels", "with --calibration: keep the N most active input channels of "
        "each layer in float32 (the packed formats made at load)", metavar="N",
    )  # fmt: skip
    dequant_cache_gib: float = option(
        M + "dequant_cache_bytes", "native weights: float32 copies kept for batched GEMMs "
        "(prefill, many sequences), up to GIB; decode reads the packed weights. 0: dequantize "
        "per call", flag="--dequant-cache", metavar="GIB", unit=GIB,
    )  # fmt: skip
    max_kld: float | None = option(
        M + "max_kld", "measure the weights' KL divergence from float32 at load (cached) and "
        "refuse to start above X", metavar="X",
    )  # fmt: skip
    dtype: str = option(M + "dtype", "older spelling of --weights float32|bfloat16", choices=DTYPES)
    quantization: str | None = option(
        M + "quantization", "older spelling of --weights int8", choices=QUANTIZATIONS
    )
    max_model_len: int | None = option(M + "max_model_len", "context length (default: the model's)")
    kv_cache_memory_gib: float = option(
        C + "kv_cache_memory_bytes", "KV cache budget in GiB", flag="--kv-cache-memory",
        metavar="GIB", unit=GIB,
    )  # fmt: skip
    num_kv_blocks: int | None = option(
        C + "num_blocks_override", "KV blocks in the pool, whatever --kv-cache-memory says",
        flag="--num-kv-blocks", metavar="N",
    )  # fmt: skip
    block_size: int = option(C + "block_size", "tokens per KV block")
    kv_cache_dtype: str = option(
        C + "cache_dtype", "the KV cache's dtype: auto (the weights' compute dtype: float32 on "
        "the CPU, bfloat16 on a GPU), float32, float16 (half a float32 pool's memory and "
        "bandwidth) or bfloat16", flag="--kv-cache-dtype", choices=KV_CACHE_DTYPES,
    )  # fmt: skip
    max_num_seqs: int = option(S + "max_num_seqs", "sequences per step")
    max_num_batched_tokens: int = option(S + "max_num_batched_tokens", "token budget per step")
    enable_chunked_prefill: bool = option(
        S + "enable_chunked_prefill", "schedule whole prompts only", flag="--no-chunked-prefill",
        kind="off",
    )  # fmt: skip
    long_prefill_token_threshold: int | None = option(
        S + "long_prefill_token_threshold", "a prompt takes at most N tokens of a step, so "
        "later prompts run beside a long one (0: off; default: "
        f"{PREFILL_ROLE_CHUNK} on a --role prefill worker, else off)", default=None, metavar="N",
    )  # fmt: skip
    scheduling_policy: str = option(
        S + "policy", flag="--scheduling-policy", choices=SCHEDULING_POLICIES
    )
    max_waiting_requests: int | None = option(
        S + "max_waiting_requests", "requests the engine lets wait (default: unbounded)",
        metavar="N",
    )  # fmt: skip
    num_threads: int | None = option(
        "num_threads", "torch threads (default: all cores)", default=None
    )
    device: str = option(
        "device", "where the model runs: auto (cuda where torch sees a GPU, else cpu), cpu, "
        "cuda", choices=DEVICES,
    )  # fmt: skip
    attention_backend: str = option(
        "attention_backend", "attention kernels: auto (the device's best), native (the CPU's C "
        "kernel), torch (SDPA), triton (the GPU's paged kernel)", choices=ATTENTION_BACKENDS,
    )  # fmt: skip
    enforce_eager: bool = option(
        "enforce_eager", "CUDA: run decode steps eagerly instead of as captured CUDA graphs",
        kind="toggle",
    )  # fmt: skip
    lora_modules: tuple[str, ...] = option(
        "lora_modules", "a LoRA adapter served beside the base model, requested by NAME as the "
        "model (a PEFT folder or a GGUF LoRA file; repeat for more)", flag="--lora",
        kind="append", metavar="NAME=PATH",
    )  # fmt: skip
    enable_lora: bool | None = option(
        "enable_lora", "LoRA adapters may be loaded at run time (POST /v1/load_lora_adapter); "
        "on whenever --lora is given (--no-enable-lora with --lora is refused)", default=None,
        kind="toggle",
    )  # fmt: skip
    max_loras: int = option("max_loras", "LoRA adapters one batch may mix")
    max_lora_rank: int = option("max_lora_rank", "adapters of a higher rank are refused")
    lora_dtype: str = option(
        "lora_dtype", "the adapters' weights (auto: float16 on the CPU over a quantized or "
        "bf16 base, else the model's dtype)", choices=LORA_DTYPES,
    )  # fmt: skip
    gpu_memory_utilization: float = option(
        C + "gpu_memory_utilization", "CUDA: share of the GPU's memory the engine may use "
        "(KV blocks sized from what a warm-up forward leaves free)", metavar="FRACTION",
    )  # fmt: skip
    load_format: str = option(
        M + "load_format", "dummy: random weights of the folder's config.json shapes (benchmark "
        "real shapes with nothing downloaded)", choices=LOAD_FORMATS,
    )  # fmt: skip
    seed: int = option(M + "seed")
    enable_prefix_caching: bool = option(
        C + "enable_prefix_caching", "disable prefix caching", flag="--no-prefix-caching",
        kind="off",
    )  # fmt: skip
    kv_offload_memory_gib: float = option(
        C + "offload_memory_bytes", "host-memory tier for evicted KV blocks",
        flag="--kv-offload-memory", metavar="GIB", unit=GIB,
    )  # fmt: skip
    kv_offload_disk_gib: float = option(
        C + "offload_disk_bytes", "disk tier for evicted KV blocks", flag="--kv-offload-disk",
        metavar="GIB", unit=GIB,
    )  # fmt: skip
    kv_offload_path: str | None = option(
        C + "offload_disk_path", "disk tier directory (default ~/.cache/tokenmill/kv)",
        flag="--kv-offload-path",
    )  # fmt: skip
    kv_events_endpoint: str | None = option(
        C + "kv_events_endpoint", "ZMQ PUB endpoint for KV events, e.g. tcp://*:5557"
    )
    kv_events_replay_endpoint: str | None = option(
        C + "kv_events_replay_endpoint", "ZMQ ROUTER endpoint for event replay"
    )
    speculative: str | None = option(
        SP + "method", "speculative decoding: ngram (prompt lookup: drafts copied from earlier "
        "in the sequence, verified in one step) or draft_head (with --speculator)",
        flag="--speculative", default=None, choices=SPECULATIVE_METHODS,
    )  # fmt: skip
    speculator: str | None = option(
        SP + "speculator", "a draft head trained for this model (`tokenmill speculator train`); "
        "implies --speculative draft_head", metavar="FILE",
    )  # fmt: skip
    num_speculative_tokens: int = option(
        SP + "num_speculative_tokens", "drafts per step", metavar="K"
    )
    speculative_draft_policy: str = option(
        SP + "draft_policy", "auto: drafts sized per request and step by measured step times "
        "and acceptance (none where they would not pay); fixed: every draft the proposer finds",
        flag="--speculative-draft-policy", choices=DRAFT_POLICIES,
    )  # fmt: skip
    speculative_lookup: bool = option(
        SP + "lookup_first", "with a draft head: try n-gram lookup first (free; where the "
        "sequence repeats itself), the head where it finds nothing", flag="--speculative-lookup",
        kind="toggle",
    )  # fmt: skip
    record_traffic: str | None = option(
        "record_traffic_dir", "write every completed request's prompt and output (text and "
        "token ids) as JSONL to DIR, to train a draft head on (`tokenmill speculator train "
        "--traces DIR`). This stores user data; off by default", flag="--record-traffic",
        metavar="DIR",
    )  # fmt: skip
    warm_up: bool = option(
        "warm_up", "skip the short request run through the model before serving (the first "
        "request then pays first-call costs; benchmarks/cold_start.py measures both)",
        flag="--no-warm-up", kind="off",
    )  # fmt: skip
    record_traffic_max_mib: int = option(
        "record_traffic_max_bytes", "stop recording once this much is written",
        flag="--record-traffic-max-mib", metavar="MIB", unit=MIB,
    )  # fmt: skip
    ngram_min: int = option(SP + "ngram_min", "shortest suffix n-gram looked up", metavar="N")
    ngram_max: int = option(SP + "ngram_max", "longest suffix n-gram looked up", metavar="N")
    # kernel switches: None leaves the $TOKENMILL_* variable's value, else the default (on)
    int_dot: bool | None = option(
        K + "int_dot", "Q4_0 / Q4_1 / Q8_0 / Q4_K / Q6_K weights run the integer-dot kernels "
        "(--no-int-dot: the fp32 GEMV and GEMM)", default=None, kind="toggle", group=KERNELS,
    )  # fmt: skip
    int_dot_max_rows: int | str | None = option(
        K + "int_dot_max_rows", "up to how many rows a step runs the integer-dot kernel rather "
        "than a GEMM: a number or 'any' (default: measured once per machine)",
        type=lambda raw: envs.parse_rows(raw, "int-dot-max-rows"), metavar="N|any",
        group=KERNELS,
    )  # fmt: skip
    int_dot_activation_bits: int | None = option(
        K + "int_dot_activation_bits", "the activations' precision in every integer-dot kernel "
        "(decode GEMV, GEMM, greedy argmax; a row gets the same bits in each): 16 (default: "
        "KLD from float32 < 1e-6, logits within 1e-2), 24 (1.5x the work: logits within "
        "1e-4 of float32's) or 8 (int8 per 32 values as llama.cpp: half of 16's work, KLD "
        "~0.003)", default=None, type=int,
        choices=envs.ACTIVATION_BITS, metavar="BITS",
        group=KERNELS,
    )  # fmt: skip
    greedy_argmax: bool | None = option(
        K + "greedy_argmax", "greedy rows read out only the lm_head's argmax "
        "(--no-greedy-argmax: every logit)", default=None, kind="toggle", group=KERNELS,
    )  # fmt: skip
    fused_decode: bool | None = option(
        K + "fused_decode", "decode steps run every layer in one native call "
        "(--no-fused-decode: layer by layer)", default=None, kind="toggle", group=KERNELS,
    )  # fmt: skip
    prefetch: bool | None = option(
        K + "prefetch", "native weights prepared while the engine imports torch",
        default=None, kind="toggle", group=KERNELS,
    )  # fmt: skip
    # `serve` only: this replica's part in prefill/decode disaggregation
    kv_role: str = option(
        KV + "role", "prefill: serve the KV blocks of requests the router marks "
        "do_remote_decode; decode: load the prompt's KV from a prefill worker for requests "
        "marked do_remote_prefill; both: neither (a plain replica)", flag="--role",
        choices=KV_ROLES, group=KV_TRANSFER,
    )  # fmt: skip
    kv_transfer_endpoint: str = option(
        KV + "endpoint", "prefill worker: where its KV block server binds (port 0: any free "
        "port; the address is reported in /server_info). Bind a reachable address across hosts",
        flag="--kv-transfer-endpoint", metavar="ENDPOINT", group=KV_TRANSFER,
    )  # fmt: skip
    kv_transfer_carrier: str = option(
        KV + "carrier", "decode worker: shm (shared memory, same host), tcp, or auto (shm when "
        "the prefill worker is on this host)", flag="--kv-transfer-carrier", choices=KV_CARRIERS,
        group=KV_TRANSFER,
    )  # fmt: skip
    kv_lease_timeout_s: float = option(
        KV + "lease_timeout_s", "prefill worker: blocks held for a decode worker at most this "
        "long", flag="--kv-lease-timeout", metavar="S", group=KV_TRANSFER,
    )  # fmt: skip
    kv_transfer_timeout_s: float = option(
        KV + "transfer_timeout_s", "decode worker: a KV load taking longer fails",
        flag="--kv-transfer-timeout", metavar="S", group=KV_TRANSFER,
    )  # fmt: skip
    kv_load_failure_policy: str = option(
        KV + "load_failure_policy", "decode worker, when a KV load fails: recompute the prompt "
        "here, or fail the request", choices=KV_LOAD_FAILURE_POLICIES, group=KV_TRANSFER,
        flag="--kv-load-failure-policy",
    )  # fmt: skip

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace, **given: Any) -> EngineArgs:
        """The arguments of a parsed command (fields without a flag there: their defaults),
        then `given` (serve's positional model)."""
        return cls(**{**namespace_values(cls, args), **given})

    def create_engine_config(self) -> EngineConfig:
        if self.record_traffic_max_mib < 1:
            raise ValueError("record-traffic-max-mib: must be >= 1")
        if self.enable_lora is False and self.lora_modules:
            raise ValueError("enable-lora: --no-enable-lora turns LoRA off, and --lora needs it")
        sections = self._settings()
        scheduler = sections["scheduler_config"]
        if self.long_prefill_token_threshold is None and self.kv_role == "prefill":
            scheduler["long_prefill_token_threshold"] = PREFILL_ROLE_CHUNK
        speculative = self.speculative or ("draft_head" if self.speculator else None)
        spec = sections["speculative_config"] | {"method": speculative}
        return EngineConfig(
            model_config=ModelConfig(**sections["model_config"]),
            cache_config=CacheConfig(**sections["cache_config"]),
            scheduler_config=SchedulerConfig(**scheduler),
            speculative_config=SpeculativeConfig(**spec) if speculative else None,
            kv_transfer_config=KVTransferConfig(**sections["kv_transfer_config"]),
            kernel_config=KernelConfig.from_env(**sections["kernel_config"]),
            **sections[""],
        )

    def _settings(self) -> dict[str, dict[str, Any]]:
        """EngineConfig section -> {setting: value} (in its units); a None the setting does
        not default to is left out (its default, or the environment's, applies)."""
        out: dict[str, dict[str, Any]] = defaultdict(dict)
        for f, arg in cli_fields(type(self)):
            value = arg.to_setting(getattr(self, f.name))
            if value is None and config_default(arg.target) is not None:
                continue
            section, _, name = arg.target.rpartition(".")
            out[section][name] = value
        return out


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """The engine's flags (and its kernel switches) on an engine-running command."""
    add_arguments(p, EngineArgs, (ENGINE, KERNELS), GROUP_TITLES)


def add_kv_transfer_args(p: argparse.ArgumentParser) -> None:
    """`serve` only: this replica's part in prefill/decode disaggregation."""
    add_arguments(p, EngineArgs, (KV_TRANSFER,), GROUP_TITLES)


def build_engine_config(model: str | None = None, **engine_args: Any) -> EngineConfig:
    """`LLM(model, **engine_args)`'s configuration (the keywords: EngineArgs' fields)."""
    return EngineArgs(model=model, **engine_args).create_engine_config()
