"""The engine core: scheduler + KV cache manager + model runner, advanced one step at a time."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import time

import torch
import zmq

from tokenmill.cache_dirs import cache_root
from tokenmill.config import EngineConfig, KernelConfig, SchedulerConfig, SpeculativeConfig
from tokenmill.engine.lora_manager import LoRAManager
from tokenmill.engine.pooling import ModelPooling, encoder_engine_config
from tokenmill.engine.startup import StartupProfile
from tokenmill.inputs.validation import validate_params, validate_prompt
from tokenmill.kernels import ops
from tokenmill.kv.connector.connector import KVConnector
from tokenmill.kv.connector.params import KVTransferParams
from tokenmill.kv.events import KVEventCollector, KVEventPublisher
from tokenmill.kv.hashing import block_hashes
from tokenmill.kv.manager import KVCacheManager, cdiv
from tokenmill.kv.offload import DiskTier, HostTier, TieredStore
from tokenmill.messages import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from tokenmill.model.attention_backends import get_attention_backend
from tokenmill.model.bert import build_encoder
from tokenmill.model.linear import NativeMethod, get_linear_method
from tokenmill.model.model_files import ModelFiles
from tokenmill.model.models import build_model
from tokenmill.model.prefetch import WeightPrefetch
from tokenmill.model.row_kernels import INT_DOT_KINDS, row_setting
from tokenmill.platform import cpu_model, resolve_device
from tokenmill.quant.weights import load_for_plan
from tokenmill.request import Request, RequestStatus
from tokenmill.sampling_params import RepetitionDetection, SamplingParams
from tokenmill.scheduler.output import ModelRunnerOutput, SchedulerOutput
from tokenmill.scheduler.scheduler import Scheduler
from tokenmill.spec.drafter import Drafter
from tokenmill.spec.proposer import build_proposer
from tokenmill.spec.traffic import TrafficRecorder
from tokenmill.stats import SchedulerStats
from tokenmill.structured.loops import RepetitionDetector
from tokenmill.structured.manager import StructuredOutputManager
from tokenmill.worker.gpu_memory import profile_num_blocks
from tokenmill.worker.model_runner import ModelRunner, kv_bytes_per_block, kv_cache_dtype

logger = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """The waiting queue is at its configured bound; the caller should retry later."""


def check_schedulable(config: SchedulerConfig, max_model_len: int) -> None:
    """Without chunked prefill a prompt is scheduled whole: the budget must hold any prompt."""
    if not config.enable_chunked_prefill and config.max_num_batched_tokens < max_model_len:
        raise ValueError(
            f"max_num_batched_tokens: {config.max_num_batched_tokens} is below the context "
            f"length {max_model_len}, so with chunked prefill off a long prompt could never "
            "be scheduled: raise --max-num-batched-tokens, lower --max-model-len or keep "
            "chunked prefill on"
        )


class _SamplingState:
    """What one step changes on a request before its outputs are applied (restored when
    the step is re-run to isolate a failure)."""

    def __init__(self, request: Request) -> None:
        self.request = request
        gen = request.generator
        self.generator_state = gen.get_state() if gen is not None else None
        self.banned_next = list(request.banned_next)
        self.prompt_logprobs_upto = request.prompt_logprobs_upto

    def restore(self) -> None:
        r = self.request
        if self.generator_state is not None and r.generator is not None:
            r.generator.set_state(self.generator_state)
        r.banned_next = list(self.banned_next)
        r.prompt_logprobs_upto = self.prompt_logprobs_upto


class EngineCore:
    def __init__(
        self,
        config: EngineConfig,
        model_files: ModelFiles | None = None,
        profile: StartupProfile | None = None,
        prefetch: WeightPrefetch | None = None,
    ) -> None:
        """`prefetch`: the start-up prefetch of this model's native weights (core_entry.py
        starts it before torch is imported)."""
        self.config = config
        self.profile = profile = profile or StartupProfile("engine-core", origin=time.time())
        torch.set_num_threads(config.num_threads)
        torch.manual_seed(config.model_config.seed)
        self.device = resolve_device(config.device)
        t0 = time.monotonic()
        files = self._build_model(model_files, prefetch)
        arch = files.arch
        model_len = config.model_config.max_model_len or arch.max_position_embeddings
        encoder_only = getattr(self.model, "encoder_only", False)
        self.pooling = ModelPooling.for_model(files.path, arch.hidden_size, encoder_only)
        if encoder_only:
            self.config = config = encoder_engine_config(config, model_len)
        cache = config.cache_config
        kv_dtype = kv_cache_dtype(cache.cache_dtype, self.model.method.dtype)
        attn_backend = get_attention_backend(config.attention_backend, self.device)
        if cache.num_blocks_override:
            num_blocks = cache.num_blocks_override
        elif self.device != "cpu":
            num_blocks = profile_num_blocks(self.model, attn_backend, config, kv_dtype)
        else:
            kv_bytes = kv_bytes_per_block(self.model, cache.block_size, kv_dtype)
            num_blocks = max(1, cache.kv_cache_memory_bytes // kv_bytes)
        # A sequence can never grow beyond what the whole pool holds.
        self.max_model_len = min(model_len, num_blocks * cache.block_size)
        check_schedulable(config.scheduler_config, self.max_model_len)
        self.vocab_size = arch.vocab_size
        self.structured = StructuredOutputManager(self.tokenizer, self.vocab_size)
        self.runner = ModelRunner(
            self.model, num_blocks, cache.block_size, attention_backend=attn_backend.name,
            kv_dtype=kv_dtype, device=self.device,
            structured=self.structured,
        )  # fmt: skip
        profile.mark("allocate KV cache")
        if self.device != "cpu" and not config.enforce_eager:
            sched = config.scheduler_config
            self.runner.capture_cuda_graphs(sched.max_num_seqs, self.max_model_len)
            profile.mark("CUDA graphs")
        self.events = KVEventCollector(cache.block_size)
        self.publisher = (
            KVEventPublisher(cache.kv_events_endpoint, cache.kv_events_replay_endpoint)
            if cache.kv_events_endpoint
            else None
        )
        store = self._build_tiers(files, kv_dtype) if cache.enable_prefix_caching else None
        self.kv_manager = KVCacheManager(
            num_blocks,
            cache.block_size,
            enable_caching=cache.enable_prefix_caching,
            store=store,
            block_io=self.runner,
            events=self.events,
            sliding_window=arch.kv_sliding_window,
        )
        self.drafter = self._build_drafter(config.speculative_config)
        self.runner.keep_features = self.drafter is not None and self.drafter.needs_features
        self.recorder = self._traffic_recorder()
        self.scheduler = Scheduler(
            config.scheduler_config,
            self.kv_manager,
            self.max_model_len,
            self.drafter,
        )
        self.lora = LoRAManager.from_config(config, self.model, self.runner, self.scheduler)
        if self.recorder is not None:
            recorder = self.recorder
            self.scheduler.on_finished = lambda r: recorder.record(
                r.prompt_token_ids, r.output_token_ids, r.finish_reason or ""
            )
        self.num_blocks = num_blocks
        self.kv_connector = (
            KVConnector(config.kv_transfer_config, self.kv_manager, self.scheduler,
                        self.runner.kv_caches)
            if config.kv_transfer_config.role != "both"
            else None
        )  # fmt: skip
        profile.mark("scheduler")
        if config.warm_up:
            self._warm_up()
            profile.mark("warm-up")
        logger.info(
            "engine ready: %s, %d KV blocks x %d tokens, max_model_len %d, %.1fs",
            self.model_name,
            num_blocks,
            cache.block_size,
            self.max_model_len,
            time.monotonic() - t0,
        )

    def _build_model(
        self, model_files: ModelFiles | None, prefetch: WeightPrefetch | None
    ) -> ModelFiles:
        """Reads the weights (unless given), builds the model, settles the kernels in
        force and checks the weights' KLD (--max-kld); the model's files."""
        config, profile = self.config, self.profile
        plan = config.model_config.plan
        files = model_files
        if files is None:
            model_config = config.model_config
            files = load_for_plan(
                model_config.model, plan, prefetch, model_config.load_format, self.device
            )
            profile.mark("read weights")
        method_name = plan.method
        if self.device != "cpu":
            if plan.overrides:
                raise ValueError("quant_plan: per-group formats run on the CPU only")
            method_name = plan.scheme
        if plan.method == "native" and self.device == "cpu":
            ops.load_kernels()  # built once per machine, then loaded from the cache
            profile.mark("native kernels")
        self.model_name = files.name
        self.tokenizer = files.tokenizer
        arch = files.arch
        self.model = build_encoder(files) or build_model(
            arch,
            files.weights,
            max_positions=config.model_config.max_model_len or arch.max_position_embeddings,
            method=get_linear_method(
                method_name,
                config.model_config.dequant_cache_bytes,
                prefetch,
                config.kernel_config,
                self.device,
            ),
            rope_freq_factors=files.rope_freq_factors,
        )
        files.weights.clear()
        profile.mark("build model")
        self.kernel_config = self._kernels_in_force(config.kernel_config)
        if prefetch is not None:
            prefetch.close()
            profile.background.update({f"prefetch {k}": v for k, v in prefetch.seconds.items()})
            logger.debug(
                "start-up prefetch: %d of %d prepared results used",
                prefetch.used,
                prefetch.prepared,
            )
        self.weights_kld = self._check_weights_kld(files)
        if self.weights_kld is not None:
            profile.mark("weights KLD check")
        return files

    def _traffic_recorder(self) -> TrafficRecorder | None:
        """--record-traffic: finished requests written as JSONL (user data: opt-in)."""
        config = self.config
        if config.record_traffic_dir is None:
            return None
        tok = self.tokenizer
        logger.warning("recording traffic (prompts and outputs) to %s", config.record_traffic_dir)
        return TrafficRecorder(
            config.record_traffic_dir,
            config.record_traffic_max_bytes,
            lambda ids: tok.decode(ids, skip_special_tokens=False),
        )

    def _build_drafter(self, spec: SpeculativeConfig | None) -> Drafter | None:
        if spec is None:
            return None
        proposer = build_proposer(spec, self.model)
        return Drafter(proposer, spec.draft_policy == "auto", self.structured.valid_prefix)

    def _warm_up(self) -> None:
        """A one-token greedy request (a one-row prefill, then a decode step) through a
        throwaway scheduler and block manager: the first-call costs of the decode path
        (thread pools, the fused decoder; ~6 ms) are paid before the first real request,
        and nothing of it shows in the prefix cache, the KV events or the stats. Measured:
        a longer warm-up prompt buys the batched path's first call ~5 ms of a 40-token
        prefill's 70, for 45 ms more start-up."""
        block_size = self.kv_manager.block_size
        prompt_len = 1
        if self.max_model_len < prompt_len + 2 or self.pooling.encoder_only:
            return
        kv = KVCacheManager(self.num_blocks, block_size, enable_caching=False)
        scheduler = Scheduler(self.config.scheduler_config, kv, self.max_model_len)
        prompt = [(7 + 31 * i) % self.vocab_size for i in range(prompt_len)]
        params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
        scheduler.add_request(
            Request("warm-up", prompt, params, self.tokenizer.eos_token_ids, self.max_model_len)
        )
        while scheduler.has_unfinished_requests():
            sched = scheduler.schedule()
            scheduler.update_from_output(sched, self.runner.execute_model(sched))

    def _check_weights_kld(self, files: ModelFiles) -> dict | None:
        """--max-kld: the weights' KL divergence from float32, measured (or read from the
        cache) at load; over the budget the engine refuses to start."""
        model_config = self.config.model_config
        if model_config.max_kld is None:
            return None
        from tokenmill.quant.gate import check_kld, measure_engine_kld

        report = measure_engine_kld(
            model_config.model, files.path, model_config.plan, self.model,
            dataclasses.asdict(self.kernel_config),
        )  # fmt: skip
        logger.info(
            "weights %s: mean KLD %.6f from float32 (budget %g)",
            report["plan"],
            report["mean_kld"],
            model_config.max_kld,
        )
        check_kld(report, model_config.max_kld)
        return report

    def _build_tiers(self, files: ModelFiles, kv_dtype: torch.dtype) -> TieredStore | None:
        cache = self.config.cache_config
        if not cache.offload_memory_bytes and not cache.offload_disk_bytes:
            return None
        host = HostTier(cache.offload_memory_bytes) if cache.offload_memory_bytes else None
        disk = None
        if cache.offload_disk_bytes:
            fingerprint = hashlib.sha256(
                repr(
                    (
                        str(files.path),
                        files.arch,
                        self.config.model_config.plan.describe(),  # the scheme alone for plain ones
                        cache.block_size,
                        kv_dtype,
                    )
                ).encode()
            ).hexdigest()
            path = cache.offload_disk_path or str(cache_root() / "kv")
            block_shape = tuple(self.runner.read_block(0).shape)
            disk = DiskTier(
                os.path.join(path, fingerprint[:16]),
                cache.offload_disk_bytes,
                block_shape,
                kv_dtype,
                fingerprint=fingerprint,
            )
        return TieredStore(host, disk, listener=self.events.tier_listener)

    # ------------------------------------------------------------ requests

    def add_request(self, req: EngineCoreRequest) -> None:
        validate_prompt(
            req.prompt_token_ids,
            self.vocab_size,
            self.max_model_len,
            req.pooling_params is not None,
        )
        validate_params(req.sampling_params, self.vocab_size)
        pooling = self.pooling.resolve(req.pooling_params)
        if req.lora_name is not None:
            if self.lora is None:
                raise ValueError("model: this server runs no LoRA adapters")
            self.lora.check(req.lora_name)
        transfer = self._transfer_params(req)
        bound = self.config.scheduler_config.max_waiting_requests
        if bound is not None and self.scheduler.num_waiting >= bound:
            raise QueueFullError(f"the waiting queue is full ({bound} requests)")
        request = Request(
            req.request_id,
            req.prompt_token_ids,
            req.sampling_params,
            self.tokenizer.eos_token_ids,
            self.max_model_len,
            arrival_time=req.arrival_time,
            priority=req.priority,
            cache_salt=req.cache_salt,
            pooling_params=pooling,
            lora_name=req.lora_name,
        )
        if self.lora is not None and req.lora_name is not None:
            request.lora_id = self.lora.lora_id(req.lora_name)  # KV events carry it
        params = req.sampling_params
        self.structured.init_request(request, params)
        repetition = params.repetition_detection
        if repetition is None or repetition is True:
            repetition = (
                self.config.repetition_detection if repetition is None else RepetitionDetection()
            )
        if repetition:
            request.repetition = RepetitionDetector(repetition)
        if transfer is not None:
            assert self.kv_connector is not None
            self.kv_connector.add(request, transfer)
        else:
            self.scheduler.add_request(request)

    def _transfer_params(self, req: EngineCoreRequest) -> KVTransferParams | None:
        if req.kv_transfer_params is None:
            return None
        try:
            params = KVTransferParams.from_json(req.kv_transfer_params)
        except ValueError as e:
            raise ValueError(f"kv_transfer_params: {e}") from None
        if self.kv_connector is None:
            raise ValueError("kv_transfer_params: this worker runs with --role both")
        self.kv_connector.check(params)
        if req.sampling_params.n > 1:
            raise ValueError("kv_transfer_params: needs n = 1")
        return params

    def abort_requests(self, request_ids: list[str]) -> None:
        if self.kv_connector is not None:
            request_ids = [rid for rid in request_ids if not self.kv_connector.abort(rid)]
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def poll_connector(self) -> list[EngineCoreOutput]:
        """KV transfer news (blocks arrived, leases ended); requests failed by a load."""
        return self.kv_connector.poll() if self.kv_connector is not None else []

    @property
    def wake_socket(self) -> zmq.Socket | None:
        """Polled by the engine loop beside its input: KV transfer news arrives here."""
        return self.kv_connector.wake_socket if self.kv_connector is not None else None

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # ------------------------------------------------------------ one step

    def step(self) -> EngineCoreOutputs:
        failed = self.poll_connector()
        outs = self._step()
        if self.kv_connector is not None:
            self.kv_connector.after_step()
        outs.outputs = failed + outs.outputs
        self._publish_events()
        return outs

    def _publish_events(self) -> None:
        events = self.events.take()
        if self.publisher is not None and events:
            self.publisher.publish(events)

    def stats(self) -> SchedulerStats:
        stats = self.scheduler.stats()
        stats.prefix_cache_hits_by_medium = dict(self.kv_manager.stats.hits_by_medium)
        if self.kv_manager.store is not None:
            stats.kv_tiers = self.kv_manager.store.stats()
        if self.kv_connector is not None:
            stats.kv_transfer = self.kv_connector.stats.to_dict()
        load = getattr(self.model, "expert_load", None)
        if load is not None:  # a MoE model: tokens per expert for /metrics
            counts = load()
            stats.expert_load = counts.tolist() if counts is not None else None
        return stats

    def speculative_info(self) -> dict | None:
        """The active speculator (for /server_info), None when speculation is off."""
        spec = self.config.speculative_config
        return dataclasses.asdict(spec) if spec is not None else None

    def _kernels_in_force(self, kernels: KernelConfig) -> KernelConfig:
        """Sets up to how many rows the packed layers run the integer-dot kernel (measured or
        stored for this machine unless configured); the switches with that limit."""
        if not isinstance(self.model.method, NativeMethod):
            return kernels
        limit = self.model.method.choose_row_kernels()
        self.profile.mark("choose row kernels")
        return dataclasses.replace(kernels, int_dot_max_rows=row_setting(limit))

    def device_info(self) -> dict:
        """Where the model runs (/server_info, /v1/models)."""
        name = cpu_model() if self.device == "cpu" else torch.cuda.get_device_name(self.device)
        return {
            "type": self.device,
            "name": name,
            "attention_backend": self.runner.attn.name,
            "dtype": str(self.model.method.dtype).removeprefix("torch."),
            "kv_dtype": str(self.runner.kv_caches[0].dtype).removeprefix("torch."),
        }

    def kernel_info(self) -> dict:
        """The kernel switches in force (the integer-dot row limit as measured or stored for
        this machine) and what this build runs, for /server_info and benchmark reports."""
        native = ops.kernels_available()
        return {
            **dataclasses.asdict(self.kernel_config),
            "native_kernels": native,
            "int_dot_kind": INT_DOT_KINDS.get(ops.int_dot_kind()) if native else None,
        }

    def reset_prefix_cache(self) -> bool:
        ok = self.kv_manager.reset_prefix_cache()
        self._publish_events()
        return ok

    def shutdown(self) -> None:
        if self.kv_connector is not None:
            self.kv_connector.shutdown()
        if self.publisher is not None:
            self.publisher.close()
        if self.recorder is not None:
            self.recorder.close()

    def _step(self) -> EngineCoreOutputs:
        start = time.perf_counter()
        sched = self.scheduler.schedule()
        if sched.is_empty:
            return EngineCoreOutputs(stats=self.stats())
        now = time.monotonic()
        for sr in sched.scheduled:
            if sr.request.first_scheduled_time is None:
                sr.request.first_scheduled_time = now
        result, failures = self._execute_isolated(sched)
        outs = []
        for request, reason in failures:
            # A fault in the forward pass or sampling fails the request(s) that caused it,
            # not the batch and not the engine.
            if self.scheduler.finish_requests([request.request_id], RequestStatus.FINISHED_ERROR):
                outs.append(
                    EngineCoreOutput(
                        request.request_id, [], finish_reason="error", stop_reason=reason
                    )
                )
        if self.drafter is not None:
            self.drafter.update_features(result.features)
        outs += self.scheduler.update_from_output(sched, result)
        if self.drafter is not None and not failures and sched.is_decode_only:
            # what a verification row costs here, measured (speculation's draft policy)
            context = sum(sr.request.num_computed_tokens for sr in sched.scheduled)
            seconds = time.perf_counter() - start
            self.drafter.observe_step(sched.num_scheduled_tokens, seconds, context)
        return EngineCoreOutputs(outs, self.stats())

    def _execute_isolated(
        self, sched: SchedulerOutput
    ) -> tuple[ModelRunnerOutput, list[tuple[Request, str]]]:
        """Runs the step; if it raises, runs each half again (recursively) so that only the
        requests that fail on their own are failed. Re-running is exact: KV writes of the
        same positions are idempotent and per-request sampling state is restored first."""
        saved = [_SamplingState(sr.request) for sr in sched.scheduled]
        try:
            return self.runner.execute_model(sched), []
        except Exception as e:
            for state in saved:
                state.restore()
            if len(sched.scheduled) == 1:
                request = sched.scheduled[0].request
                logger.exception("request %s failed in the engine", request.request_id)
                return ModelRunnerOutput({}, {}, {}), [(request, f"{type(e).__name__}: {e}")]
            logger.warning(
                "a step of %d requests failed (%s: %s); isolating the cause",
                len(sched.scheduled), type(e).__name__, e,
            )  # fmt: skip
        half = len(sched.scheduled) // 2
        merged = ModelRunnerOutput({}, {}, {})
        failures: list[tuple[Request, str]] = []
        for part in (sched.scheduled[:half], sched.scheduled[half:]):
            sub = SchedulerOutput(part, sum(sr.num_new_tokens for sr in part))
            result, failed = self._execute_isolated(sub)
            merged.sampled_token_ids.update(result.sampled_token_ids)
            merged.logprobs.update(result.logprobs)
            merged.prompt_logprobs.update(result.prompt_logprobs)
            merged.pooled.update(result.pooled)
            failures += failed
        return merged, failures

    def block_accounting(self) -> dict:
        """Blocks by state, and whether the invariants hold (tests read it over HTTP)."""
        pool = self.kv_manager.pool
        try:
            self.check_invariants()
            problem = None
        except AssertionError as e:
            problem = str(e) or "invariant violated"
        producer = self.kv_connector.producer if self.kv_connector else None
        return {
            "num_blocks": pool.num_blocks,
            "used_blocks": pool.num_used_blocks,
            "leased_blocks": producer.leased_blocks() if producer else 0,
            "parked_requests": self.kv_connector.num_parked if self.kv_connector else 0,
            "invariant_violation": problem,
        }

    def kv_digests(self, token_ids: list[int], cache_salt: str | None = None) -> list[str | None]:
        """SHA-256 of each full block of a prompt as this engine's device pool holds it (None
        where it holds none): two engines' KV compared without moving it."""
        bs = self.kv_manager.block_size
        ids = [int(t) for t in token_ids[: self.max_model_len]]
        out: list[str | None] = []
        for h in block_hashes(ids, bs, cache_salt):
            block = self.kv_manager.pool.lookup(h)
            data = self.runner.read_block(block.block_id) if block is not None else None
            out.append(
                hashlib.sha256(data.numpy().tobytes()).hexdigest() if data is not None else None
            )
        return out

    def check_invariants(self) -> None:
        """Block accounting: free + used = total, and requests hold exactly the used refs."""
        self.kv_manager.check_invariants()
        for rid, req in self.scheduler.requests.items():
            held = len(self.kv_manager.get_block_ids(rid))
            if req.status == RequestStatus.RUNNING:
                assert held >= cdiv(req.num_computed_tokens, self.kv_manager.block_size)
            else:
                assert held == 0, f"{rid} holds {held} blocks while {req.status.name}"
