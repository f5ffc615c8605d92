"""Offline API: `LLM(model).generate(prompts, SamplingParams(...))`, shaped like vLLM's."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from tokenmill.engine.arg_utils import EngineArgs
from tokenmill.engine.processor import PromptType
from tokenmill.lora_request import LoRARequest
from tokenmill.outputs import EmbeddingOutput, EmbeddingRequestOutput, RequestOutput
from tokenmill.pooling_params import PoolingParams
from tokenmill.sampling_params import RequestOutputKind, SamplingParams

Conversation = list[dict[str, Any]]


class LLM:
    """Offline batch inference. `model=None` loads the embedded SmolLM2-135M-Instruct;
    `engine_args`: EngineArgs' fields (`kv_cache_memory_gib=0.5`, `int_dot=False`, ...)."""

    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        config = EngineArgs(model=model, **engine_args).create_engine_config()
        prefetch = None
        if "torch" not in sys.modules:  # native weights prepared while torch is imported
            from tokenmill.model.prefetch import start_prefetch

            prefetch = start_prefetch(config)
        from tokenmill.engine.llm_engine import LLMEngine

        self.engine = LLMEngine(config, prefetch)

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        priority: Sequence[int] | None = None,
        use_progress: bool = False,
        lora_name: str | Sequence[str | None] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """`lora_name`: the LoRA adapter of every prompt, or one per prompt (None: the base);
        or vLLM's `lora_request` (loaded on first use)."""
        if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, list) and prompts and all(isinstance(t, int) for t in prompts)
        ):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        params = sampling_params if sampling_params is not None else SamplingParams()
        if isinstance(params, SamplingParams):
            params_list = [params] * len(prompts)
        else:
            params_list = list(params)
            if len(params_list) != len(prompts):
                raise ValueError("sampling_params: the list must be as long as the prompts")
        if lora_request is not None:
            lora_name = self._lora_names(lora_request)
        loras = (
            [lora_name] * len(prompts)
            if lora_name is None or isinstance(lora_name, str)
            else list(lora_name)
        )
        if len(loras) != len(prompts):
            raise ValueError("lora_name: the list must be as long as the prompts")
        return self._run(
            [(p, sp) for p, sp in zip(prompts, params_list, strict=True)], priority, use_progress,
            loras,
        )  # fmt: skip

    def _lora_names(
        self, requests: LoRARequest | Sequence[LoRARequest | None]
    ) -> str | list[str | None]:
        """The adapters' names, each loaded where it is not yet."""
        single = isinstance(requests, LoRARequest)
        items = [requests] if single else list(requests)  # type: ignore[list-item]
        manager = self.engine.core.lora
        for item in items:
            if item is None or (manager is not None and item.lora_name in manager.model.adapters):
                continue
            if manager is None:
                raise ValueError(
                    "lora_request: this LLM serves no adapters; start it with enable_lora=True"
                    " (or lora_modules)"
                )
            manager.load(item.lora_name, item.lora_path)
        names = [None if item is None else item.lora_name for item in items]
        return names[0] if single else names  # type: ignore[return-value]

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        use_progress: bool = False,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts: list[PromptType] = []
        for conv in conversations:
            text, ids = self.engine.processor.render_chat(
                conv, add_generation_prompt, tools, chat_template_kwargs
            )  # type: ignore[arg-type]
            prompts.append({"prompt": text, "prompt_token_ids": ids})
        return self.generate(
            prompts, sampling_params, use_progress=use_progress, lora_request=lora_request
        )

    def _run(
        self,
        items: list[tuple[PromptType, SamplingParams]],
        priority: Sequence[int] | None,
        use_progress: bool,
        lora_names: Sequence[str | None] | None = None,
    ) -> list[RequestOutput]:
        engine = self.engine
        ids = []
        try:
            for i, (prompt, params) in enumerate(items):
                if params.output_kind == RequestOutputKind.CUMULATIVE:
                    # generate() returns finished outputs only: skip building partial ones
                    params = params.clone(output_kind=RequestOutputKind.FINAL_ONLY)
                rid = engine.new_request_id()
                engine.add_request(
                    rid, prompt, params, priority[i] if priority else 0,
                    lora_name=lora_names[i] if lora_names else None,
                )  # fmt: skip
                ids.append(rid)
        except Exception:
            for rid in ids:
                engine.abort_request(rid)
            raise
        finals: dict[str, RequestOutput] = {}
        progress = None
        if use_progress:
            from rich.progress import Progress

            progress = Progress()
            task = progress.add_task("generating", total=len(ids))
            progress.start()
        try:
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished:
                        finals[out.request_id] = out
                        if progress is not None:
                            progress.advance(task)
        finally:
            if progress is not None:
                progress.stop()
        return [finals[rid] for rid in ids]

    def embed(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingParams | None = None,
    ) -> list[EmbeddingRequestOutput]:
        """One pooled vector per prompt, batched through the scheduler (vLLM's LLM.embed:
        `outs[i].outputs.embedding`)."""
        if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, list) and prompts and all(isinstance(t, int) for t in prompts)
        ):
            prompts = [prompts]  # type: ignore[list-item]
        engine = self.engine
        params = SamplingParams(max_tokens=1, output_kind=RequestOutputKind.FINAL_ONLY)
        pooling = pooling_params or PoolingParams()
        ids = []
        try:
            for prompt in prompts:  # type: ignore[union-attr]
                ids.append(engine.new_request_id())
                engine.add_request(ids[-1], prompt, params, pooling_params=pooling)
        except Exception:
            for rid in ids:
                engine.abort_request(rid)
            raise
        done: dict[str, EmbeddingRequestOutput] = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    if out.pooled is None:
                        reason = out.outputs[0].stop_reason if out.outputs else None
                        raise RuntimeError(f"request {out.request_id} failed: {reason}")
                    done[out.request_id] = EmbeddingRequestOutput(
                        out.request_id, out.prompt_token_ids, EmbeddingOutput(out.pooled)
                    )
        return [done[rid] for rid in ids]
