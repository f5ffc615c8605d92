"""Frozen engine configuration: what the user asked for, validated once at start-up."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Any

from tokenmill import envs
from tokenmill.platform import DEVICES
from tokenmill.quant.plan import QuantPlan, read_plan
from tokenmill.quant.schemes import SCHEMES
from tokenmill.sampling_params import RepetitionDetection

GiB = 1 << 30


WEIGHT_FORMATS = SCHEMES
DTYPES = ("float32", "bfloat16")  # --dtype, the older spelling of --weights
QUANTIZATIONS = ("int8",)  # --quantization, ditto
SCHEDULING_POLICIES = ("fcfs", "priority")
ATTENTION_BACKENDS = ("auto", "native", "torch", "triton")
LOAD_FORMATS = ("auto", "dummy")
LORA_DTYPES = ("auto", "float32", "float16")
# --kv-cache-dtype: "auto" stores K/V in the weights' compute dtype (float32 on the CPU,
# bfloat16 on a GPU); float16 halves a float32 pool (the CPU's paged kernels read it)
KV_CACHE_DTYPES = ("auto", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class ModelConfig:
    """Which model to load and how to run its weights."""

    model: str | None = None  # None: the embedded SmolLM2-135M-Instruct
    # Linear layers in float32 (matches transformers to ~1e-5) or bfloat16 (bf16 weights and
    # GEMM inputs, fp32 accumulation; norms, attention and KV cache stay float32).
    dtype: str = "float32"
    # Weight quantization applied at load time: None (as stored, dequantized to `dtype`)
    # or "int8" (weight-only per-channel int8 with per-row dynamic activation quantization).
    quantization: str | None = None
    max_model_len: int | None = None  # None: the model's context length
    seed: int = 0
    # How weights run (--weights, a scheme of quant/plan.py): "native" (the file's GGUF blocks
    # kept packed and run by native kernels), "float32", "bfloat16", "int8" or a GGUF format
    # made at load ("q8_0", "q4_0", ...). None: from dtype / quantization, the older spelling,
    # and by default "native" (the file's format; a float file runs as float32).
    weights: str | None = None
    # A plan file from `tokenmill quant search` (scheme + per-group formats + calibration).
    quant_plan: str | None = None
    # Calibration text for schemes made at load: "builtin" or a file path (None: none).
    calibration: str | None = None
    # Input channels per layer kept in float32 by calibration (packed formats made at load).
    outlier_channels: int = 0
    # float32 copies of packed weights kept for batched GEMMs (prefill, many sequences), up
    # to this many bytes; decode rows always read the packed weights. 0: dequantize per call.
    dequant_cache_bytes: int = 2 * (1 << 30)
    # Refuse to start when the weights' KL divergence from float32 exceeds this.
    max_kld: float | None = None
    # "auto": the folder's or file's weights; "dummy": random weights of config.json's shapes
    # (benchmarks of real shapes with nothing downloaded)
    load_format: str = "auto"
    # The quantization plan these fields describe (a plan file is read once, here).
    plan: QuantPlan = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: unsupported value {self.dtype!r}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization: unsupported value {self.quantization!r}")
        if self.weights is not None:
            if self.weights not in WEIGHT_FORMATS:
                raise ValueError(
                    f"weights: unsupported value {self.weights!r} (one of {WEIGHT_FORMATS})"
                )
            if self.dtype != "float32" or self.quantization is not None:
                raise ValueError("weights: give --weights or --dtype/--quantization, not both")
        if self.quant_plan is not None and (
            self.weights is not None or self.calibration or self.outlier_channels
        ):
            raise ValueError("quant_plan: the plan sets the weights and calibration; give one")
        if self.quant_plan is not None and (self.dtype != "float32" or self.quantization):
            raise ValueError("quant_plan: give --quant-plan or --dtype/--quantization, not both")
        if self.dequant_cache_bytes < 0:
            raise ValueError("dequant_cache_bytes: must be >= 0")
        if self.max_kld is not None and not (self.max_kld >= 0):
            raise ValueError("max_kld: must be a number >= 0")
        if self.max_model_len is not None and self.max_model_len <= 0:
            raise ValueError("max_model_len: must be positive")
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(
                f"load_format: unknown value {self.load_format!r} (one of {', '.join(LOAD_FORMATS)})"
            )
        object.__setattr__(self, "plan", self._resolve_plan())

    @property
    def weight_format(self) -> str:
        """The scheme most weights run in."""
        return self.plan.scheme

    def _resolve_plan(self) -> QuantPlan:
        if self.quant_plan is not None:
            return read_plan(self.quant_plan)[0]
        if self.weights is not None:
            scheme = self.weights
        elif self.quantization == "int8":
            scheme = "int8"
        elif self.dtype == "bfloat16":
            scheme = "bfloat16"
        else:  # the default: the file's own format (float files run as float32)
            scheme = "native"
        return QuantPlan(
            scheme, calibration=self.calibration, outlier_channels=self.outlier_channels
        )


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache: block size and the memory budget that sizes the block pool."""

    block_size: int = 16
    kv_cache_memory_bytes: int = 2 * GiB
    # CUDA: the share of the GPU's memory the engine may use (weights, activations and KV
    # blocks, sized from what is free after a warm-up forward)
    gpu_memory_utilization: float = 0.9
    num_blocks_override: int | None = None  # tests force tiny pools with this
    cache_dtype: str = "auto"  # KV_CACHE_DTYPES
    enable_prefix_caching: bool = True
    # Lower tiers for evicted blocks (0 disables the tier).
    offload_memory_bytes: int = 0
    offload_disk_bytes: int = 0
    offload_disk_path: str | None = None  # default: ~/.cache/tokenmill/kv/<model fingerprint>
    # KV events (ZMQ PUB + replay ROUTER endpoints), e.g. "tcp://*:5557"
    kv_events_endpoint: str | None = None
    kv_events_replay_endpoint: str | None = None

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise ValueError("block_size: must be a positive power of two")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization: must be in (0, 1]")
        if self.kv_cache_memory_bytes <= 0:
            raise ValueError("kv_cache_memory_bytes: must be positive")
        if self.cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"cache_dtype: one of {', '.join(KV_CACHE_DTYPES)}")
        if self.num_blocks_override is not None and self.num_blocks_override < 1:
            raise ValueError("num_blocks_override: must be >= 1")
        if self.offload_memory_bytes < 0 or self.offload_disk_bytes < 0:
            raise ValueError("offload sizes must be >= 0")


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching limits for one engine step."""

    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    policy: str = "fcfs"  # "fcfs" or "priority"
    max_waiting_requests: int | None = None  # None: unbounded queue (the server bounds it)
    # vLLM's name: a prompt chunk never takes more than this per step (0: off), so prompts
    # that arrive later run beside a long one instead of waiting for its whole prefill (a
    # prefill worker shares its steps between prompts; see router/disagg.py)
    long_prefill_token_threshold: int = 0

    def __post_init__(self) -> None:
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold: must be >= 0")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs: must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens: must be >= 1")
        if self.policy not in SCHEDULING_POLICIES:
            raise ValueError(f"policy: must be 'fcfs' or 'priority', got {self.policy!r}")


SPECULATIVE_METHODS = ("ngram", "draft_head")
DRAFT_POLICIES = ("auto", "fixed")
# Verification rows per step (the native integer-dot GEMV's rows): drafts go to decoding
# requests while the step's single-token rows stay within it, so speculation switches itself
# off as the batch fills.
MAX_SPEC_ROWS = 8


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding: a proposer drafts up to `num_speculative_tokens` per step."""

    method: str = "ngram"
    num_speculative_tokens: int = 4
    ngram_min: int = 2  # n-gram prompt lookup: suffix lengths tried, longest first
    ngram_max: int = 5
    # "auto": drafts per request and step sized by measured step times and the request's
    # recent acceptance (none where they would not pay); "fixed": every draft proposed
    draft_policy: str = "auto"
    speculator: str | None = None  # draft head file (method "draft_head")
    # draft_head: n-gram lookup first (free: where the sequence repeats itself its drafts are
    # long and mostly right), the head where it finds nothing
    lookup_first: bool = True

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative method: must be one of {SPECULATIVE_METHODS}")
        if not 1 <= self.num_speculative_tokens < MAX_SPEC_ROWS:
            raise ValueError(f"num_speculative_tokens: must be in [1, {MAX_SPEC_ROWS - 1}]")
        if not 1 <= self.ngram_min <= self.ngram_max <= 64:
            raise ValueError("ngram_min / ngram_max: need 1 <= min <= max <= 64")
        if (self.method == "draft_head") != (self.speculator is not None):
            raise ValueError("speculator: a draft head file goes with method draft_head")
        if self.draft_policy not in DRAFT_POLICIES:
            raise ValueError(f"draft_policy: must be one of {DRAFT_POLICIES}")


@dataclass(frozen=True)
class KernelConfig:
    """Which kernels run: the A/B switches benchmarks compare. Each is also a TOKENMILL_*
    variable (tokenmill/envs.py), the default when no flag, config key or keyword sets it."""

    # Q4_0 / Q4_1 / Q8_0 / Q4_K / Q6_K weights run the integer-dot kernels (else fp32 GEMV/GEMM)
    int_dot: bool = True
    # up to how many rows the integer-dot kernel runs: None measured once per machine
    # (model/row_kernels.py), a number, or "any"
    int_dot_max_rows: int | str | None = None
    # the activations' precision in every integer-dot kernel (the decode GEMV, the GEMM, the
    # greedy argmax, the fused decoder): a row gets the same bits whichever runs it, so its
    # logits never depend on the step (speculative verification stays lossless, a cache hit
    # equals a miss). 16 (two digits per value: KLD from float32 < 1e-6 on the embedded
    # model and a Qwen3-shaped Q4_K_M one, logits within 1e-2 of the float32 method's,
    # measured 8.2e-3; prefill 1.1-1.4x as fast as at 24), 24 (three
    # digits: logits within 1e-4, the order of fp32 rounding) or 8 (one int8 per value and
    # 32-value block, as llama.cpp's: a third of 24's work, KLD 0.0035)
    int_dot_activation_bits: int = 16
    greedy_argmax: bool = True  # greedy rows read out only the lm_head's argmax
    fused_decode: bool = True  # decode steps in one native call (model/fused_decode.py)
    prefetch: bool = True  # native weights prepared while torch is imported (prefetch.py)

    def __post_init__(self) -> None:
        rows = self.int_dot_max_rows
        number = isinstance(rows, int) and not isinstance(rows, bool) and rows >= 1
        if not (rows is None or rows == envs.ANY_ROWS or number):
            raise ValueError(f"int_dot_max_rows: a number (1 or more) or 'any', got {rows!r}")
        if self.int_dot_activation_bits not in envs.ACTIVATION_BITS:
            bits = self.int_dot_activation_bits
            raise ValueError(f"int_dot_activation_bits: 8, 16 or 24, got {bits!r}")

    @classmethod
    def from_env(cls, **given: object) -> KernelConfig:
        """The settings given (None: not given) over the environment's over the defaults."""
        values = envs.overrides("kernel_config")
        values.update({k: v for k, v in given.items() if v is not None})
        return cls(**values)


def default_num_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)))


KV_ROLES = ("both", "prefill", "decode")
KV_CARRIERS = ("auto", "tcp", "shm")
KV_LOAD_FAILURE_POLICIES = ("recompute", "fail")


@dataclass(frozen=True)
class KVTransferConfig:
    """Prefill/decode disaggregation: a prefill worker serves its requests' KV blocks to the
    decode workers that pull them (tokenmill/kv/connector)."""

    role: str = "both"  # "prefill" serves KV blocks, "decode" loads them, "both" neither
    # where a prefill worker's KV server binds (port 0: any free port, reported in server_info)
    endpoint: str = "tcp://127.0.0.1:0"
    carrier: str = "auto"  # decode side: "shm" for a peer on this host, else "tcp"
    lease_timeout_s: float = 60.0  # prefill side: blocks held for a puller at most this long
    transfer_timeout_s: float = 120.0  # decode side: a pull that takes longer is a failure
    load_failure_policy: str = "recompute"  # decode side, when a transfer fails
    chunk_blocks: int = 32  # blocks per reply (one frame per layer)

    def __post_init__(self) -> None:
        if self.role not in KV_ROLES:
            raise ValueError(f"role: must be one of {', '.join(KV_ROLES)}")
        if self.carrier not in KV_CARRIERS:
            raise ValueError(f"kv_transfer_carrier: must be one of {', '.join(KV_CARRIERS)}")
        if self.load_failure_policy not in KV_LOAD_FAILURE_POLICIES:
            raise ValueError(
                "kv_load_failure_policy: must be one of " + ", ".join(KV_LOAD_FAILURE_POLICIES)
            )
        if not (self.lease_timeout_s > 0 and self.transfer_timeout_s > 0):
            raise ValueError("kv lease and transfer timeouts: must be > 0")
        if not 1 <= self.chunk_blocks <= 1024:
            raise ValueError("kv_transfer_chunk_blocks: must be in [1, 1024]")
        if not self.endpoint.startswith("tcp://"):
            raise ValueError("kv_transfer_endpoint: must be tcp://HOST:PORT")


@dataclass(frozen=True)
class EngineConfig:
    model_config: ModelConfig = field(default_factory=ModelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    num_threads: int = field(default_factory=default_num_threads)
    # where the model runs: "auto" (cuda where torch sees a GPU, else cpu), "cpu" or "cuda"
    device: str = "auto"
    # attention kernels: "auto" (the device's best), "native" (the CPU's C kernel), "torch"
    # (SDPA over gathered blocks) or "triton" (the GPU's paged kernel)
    attention_backend: str = "auto"
    # CUDA: decode and verification steps run eagerly instead of as captured CUDA graphs
    enforce_eager: bool = False
    # LoRA adapters served beside the base ("NAME=PATH": a PEFT folder or a GGUF LoRA file);
    # enable_lora: adapters may be loaded at run time (/v1/load_lora_adapter) even with none
    lora_modules: tuple[str, ...] = ()
    enable_lora: bool = False
    max_loras: int = 8  # distinct adapters one batch may mix
    max_lora_rank: int = 64  # adapters of a higher rank are refused
    # the adapters' weights: "auto" is float16 on the CPU over a quantized or bf16 base (the
    # deltas' bytes halved; float32 over a float32 base), the activations' dtype on a GPU
    lora_dtype: str = "auto"
    # Loop cut-off for requests that do not set their own (None: off).
    repetition_detection: RepetitionDetection | None = field(default_factory=RepetitionDetection)
    speculative_config: SpeculativeConfig | None = None  # None: no speculative decoding
    # Finished requests written as JSONL here (user data: opt-in), up to this many bytes
    record_traffic_dir: str | None = None
    record_traffic_max_bytes: int = 256 << 20
    # one short request through the model before serving (first-call costs paid up front)
    warm_up: bool = True
    kv_transfer_config: KVTransferConfig = field(default_factory=KVTransferConfig)
    kernel_config: KernelConfig = field(default_factory=KernelConfig.from_env)

    def __post_init__(self) -> None:
        if self.max_loras < 1 or self.max_lora_rank < 1:
            raise ValueError("max_loras and max_lora_rank: must be at least 1")
        if self.lora_dtype not in LORA_DTYPES:
            raise ValueError(
                f"lora_dtype: unknown value {self.lora_dtype!r} (one of {', '.join(LORA_DTYPES)})"
            )
        if self.device not in DEVICES:
            raise ValueError(f"device: unknown value {self.device!r} (one of {', '.join(DEVICES)})")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend: unknown value {self.attention_backend!r} "
                f"(one of {', '.join(ATTENTION_BACKENDS)})"
            )


def kernels_in_force(config: EngineConfig, report: dict[str, Any] | None) -> EngineConfig:
    """`config` with the kernel switches its engine core reports in force (EngineCore's
    kernel_info: the integer-dot row limit measured or stored for this machine)."""
    if not report:
        return config
    names = {f.name for f in fields(KernelConfig)}
    kernels = KernelConfig(**{k: v for k, v in report.items() if k in names})
    return replace(config, kernel_config=kernels)
