"""Synchronous engine: input processing, an in-process engine core, output processing."""

from __future__ import annotations

import itertools
import time

from tokenmill.config import EngineConfig
from tokenmill.engine.core import EngineCore
from tokenmill.engine.output_processor import OutputProcessor
from tokenmill.engine.processor import InputProcessor, PromptType
from tokenmill.engine.startup import StartupProfile
from tokenmill.model.prefetch import WeightPrefetch
from tokenmill.outputs import RequestOutput
from tokenmill.platform import resolve_device
from tokenmill.pooling_params import PoolingParams
from tokenmill.quant.weights import load_for_plan
from tokenmill.sampling_params import SamplingParams


class LLMEngine:
    def __init__(self, config: EngineConfig, prefetch: WeightPrefetch | None = None) -> None:
        """`prefetch`: native weights being prepared since before torch was imported."""
        profile = StartupProfile("LLM", origin=time.time())  # logged at debug level
        mc = config.model_config
        device = resolve_device(config.device)
        files = load_for_plan(mc.model, mc.plan, prefetch, mc.load_format, device)
        profile.mark("read weights")
        self.chat_template = files.chat_template
        self.core = EngineCore(config, files, profile, prefetch)
        self.tokenizer = self.core.tokenizer
        self.processor = InputProcessor(
            self.tokenizer, files.chat_template, self.core.max_model_len, self.core.vocab_size
        )
        self.output_processor = OutputProcessor(self.tokenizer)
        self._ids = itertools.count()

    @property
    def max_model_len(self) -> int:
        return self.core.max_model_len

    def new_request_id(self) -> str:
        return f"req-{next(self._ids)}"

    def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams,
        priority: int = 0,
        cache_salt: str | None = None,
        pooling_params: PoolingParams | None = None,
        lora_name: str | None = None,
    ) -> None:
        text, token_ids = self.processor.tokenize_prompt(prompt)
        self.processor.validate(token_ids, params, pooling_params is not None)
        child_ids = self.output_processor.add_request(request_id, text, token_ids, params)
        try:
            for req in self.processor.make_requests(
                request_id, token_ids, params, child_ids, time.monotonic(), priority, cache_salt,
                pooling_params=pooling_params, lora_name=lora_name,
            ):  # fmt: skip
                self.core.add_request(req)
        except Exception:
            self.abort_request(request_id)
            raise

    def abort_request(self, request_id: str) -> None:
        self.core.abort_requests(self.output_processor.abort_request(request_id))

    def has_unfinished_requests(self) -> bool:
        return self.core.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        core_out = self.core.step()
        outputs, to_abort = self.output_processor.process_outputs(core_out.outputs)
        if to_abort:
            self.core.abort_requests(to_abort)
        return outputs
