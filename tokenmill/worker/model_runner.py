"""Runs one scheduler step: flat batch -> forward -> logits of sampled rows -> tokens."""

from __future__ import annotations

from typing import Any

import torch

from tokenmill.messages import PositionLogprobs
from tokenmill.model.attention import AttentionBackend
from tokenmill.model.attention_backends import get_attention_backend
from tokenmill.model.llama import LlamaForCausalLM
from tokenmill.model.lora_layers import LoRAModel
from tokenmill.request import Request
from tokenmill.sampling.metadata import SamplingMetadata
from tokenmill.sampling.sampler import LogprobsTensors, Sampler, gather_logprobs
from tokenmill.scheduler.output import ModelRunnerOutput, ScheduledRequest, SchedulerOutput
from tokenmill.spec.verify import accept_drafts
from tokenmill.structured.manager import StructuredOutputManager
from tokenmill.structured.token_mask import allowed_mask
from tokenmill.worker.input_batch import build_model_input
from tokenmill.worker.pooler import pool_chunk

# Prompt-logprob rows are turned into log-softmax in slices of this many positions.
_PROMPT_LOGPROBS_SLICE = 256


def kv_cache_dtype(setting: str, compute: torch.dtype) -> torch.dtype:
    """--kv-cache-dtype: "auto" is the weights' compute dtype, else the dtype named."""
    return compute if setting == "auto" else getattr(torch, setting)


def kv_bytes_per_block(model: LlamaForCausalLM, block_size: int, dtype: torch.dtype) -> int:
    cfg = model.config
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * block_size * cfg.num_key_value_heads * cfg.head_dim * elem * cfg.num_hidden_layers


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        num_blocks: int,
        block_size: int,
        attention_backend: str | None = None,
        kv_dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        structured: StructuredOutputManager | None = None,
    ) -> None:
        cfg = model.config
        self.model = model
        self.block_size = block_size
        self.device = torch.device(device)
        self.attn: AttentionBackend = get_attention_backend(attention_backend, device)(
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            block_size,
            cfg.sliding_window,
        )
        self.kv_caches = [
            self.attn.allocate_kv_cache(num_blocks, kv_dtype, device)
            for _ in range(cfg.num_hidden_layers)
        ]
        self.sampler = Sampler(structured)
        self.keep_features = False  # report each request's last hidden state (draft heads)
        self.cuda_graphs = None  # decode steps as CUDA graphs (capture_cuda_graphs)
        self.lora: LoRAModel | None = None  # the served LoRA adapters (--lora)

    def read_block(self, block_id: int) -> torch.Tensor:
        """One block's K and V for every layer: [num_layers, 2, block_numel], a copy in host
        memory (the lower tiers keep it there)."""
        return torch.stack([kv[:, block_id] for kv in self.kv_caches]).to("cpu")

    def write_block(self, block_id: int, data: torch.Tensor) -> None:
        for layer, kv in enumerate(self.kv_caches):
            kv[:, block_id].copy_(data[layer])

    def write_blocks(self, writes: list[tuple[int, Any]]) -> None:
        """Many blocks at once: runs of blocks received in one chunk (BlockViews of the same
        frames, consecutive) go in with one index_copy_ per layer, the rest one by one."""
        i = 0
        while i < len(writes):
            block_id, data = writes[i]
            layers = getattr(data, "layers", None)
            j = i + 1
            while (
                layers is not None and j < len(writes)
                and getattr(writes[j][1], "layers", None) is layers
                and writes[j][1].j == writes[j - 1][1].j + 1
            ):  # fmt: skip
                j += 1
            if j - i == 1:
                self.write_block(block_id, data)
            else:
                ids = torch.tensor([b for b, _ in writes[i:j]], device=self.device)
                first = data.j
                for kv, src in zip(self.kv_caches, layers, strict=True):
                    kv.index_copy_(1, ids, src[:, first : first + j - i].to(self.device, kv.dtype))
            i = j

    @torch.inference_mode()
    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        inp = build_model_input(sched.scheduled, self.block_size)
        inp = inp.to(self.device)
        if self.lora is not None:  # each request's rows get its adapter's deltas
            rows = [(sr.request.lora_name, start, sr.num_new_tokens)
                    for sr, start in zip(inp.ordered, inp.query_starts, strict=True)]  # fmt: skip
            self.lora.begin_step(rows, inp.input_ids.shape[0])
        try:
            hidden = self._forward(inp)
        finally:
            if self.lora is not None:
                self.lora.end_step()

        sample_rows: list[int] = []
        sample_reqs: list[Request] = []
        verify: list[tuple[ScheduledRequest, int]] = []
        prompt_lp: dict[str, list[PositionLogprobs]] = {}
        pooled: dict[str, list[float]] = {}
        for sr, start in zip(inp.ordered, inp.query_starts, strict=True):
            req = sr.request
            if req.pooling_params is not None:
                chunk = hidden[start : start + sr.num_new_tokens]
                vector = pool_chunk(self.model, req, chunk, sr.samples)
                if vector is not None:
                    pooled[req.request_id] = vector
                continue
            if sr.spec_token_ids:
                verify.append((sr, start))
                continue
            if req.prompt_logprobs_upto < req.num_prompt_tokens - 1:
                lps = self._prompt_logprobs(hidden[start : start + sr.num_new_tokens], req)
                if lps:
                    prompt_lp[req.request_id] = lps
            if sr.samples:
                sample_rows.append(start + sr.num_new_tokens - 1)
                sample_reqs.append(req)

        sampled: dict[str, list[int]] = {}
        logprobs: dict[str, list[PositionLogprobs]] = {}
        features: dict[str, torch.Tensor] = {}
        if verify:
            self._verify(hidden, verify, sampled, logprobs, features)
        if sample_reqs:
            meta = SamplingMetadata.from_requests(sample_reqs)
            rows_hidden = hidden[sample_rows]
            tokens, lps = self._greedy(rows_hidden, meta), None
            if tokens is None:
                out = self.sampler(self.model.compute_logits(rows_hidden), meta)
                tokens, lps = out.sampled_token_ids.tolist(), out.logprobs
            for row, req in enumerate(sample_reqs):
                sampled[req.request_id] = [tokens[row]]
                if self.keep_features:
                    features[req.request_id] = hidden[sample_rows[row]].clone()
                k = req.sampling_params.logprobs
                if k is not None and lps is not None:
                    logprobs[req.request_id] = [_position(lps, row, k)]
        return ModelRunnerOutput(sampled, logprobs, prompt_lp, features, pooled)

    def _forward(self, inp) -> torch.Tensor:
        """The step's hidden states: a captured CUDA graph for decode-only steps where one
        fits (none with LoRA deltas, whose rows change per step), else eagerly."""
        meta, rows = inp.attn_metadata, inp.input_ids.shape[0]
        graphs = self.cuda_graphs
        if graphs is not None and self.lora is None and graphs.supports(meta, rows):
            return graphs.forward(inp.input_ids, inp.positions, meta)
        return self.model.forward(inp.input_ids, inp.positions, self.kv_caches, self.attn, meta)

    def capture_cuda_graphs(self, max_num_seqs: int, max_model_len: int) -> None:
        """Decode steps from now on replay CUDA graphs (Triton attention on a GPU only, for
        models whose steps have fixed shapes: not the mixture-of-experts families)."""
        if self.device.type != "cuda" or self.attn.name != "triton":
            return
        if not getattr(self.model, "cuda_graph_safe", True):
            return
        from tokenmill.worker.cuda_graphs import CUDAGraphRunner

        self.cuda_graphs = CUDAGraphRunner(
            self.model, self.attn, self.kv_caches, max_num_seqs, max_model_len
        )

    def _verify(
        self,
        hidden: torch.Tensor,
        verify: list[tuple[ScheduledRequest, int]],
        sampled: dict[str, list[int]],
        logprobs: dict[str, list[PositionLogprobs]],
        features: dict[str, torch.Tensor],
    ) -> None:
        """Drafts checked against the target's own pick at every drafted position: the
        sampler runs on each position as if the drafts before it had been sampled (see
        accept_drafts); logprobs are the target distribution's."""
        rows = [start + i for sr, start in verify for i in range(sr.num_new_tokens)]
        requests = [sr.request for sr, _ in verify for _ in range(sr.num_new_tokens)]
        drafted = [sr.spec_token_ids[:i] for sr, _ in verify for i in range(sr.num_new_tokens)]
        # a seeded request draws one uniform per position; it keeps those of accepted ones
        seeded = {sr.request.request_id: sr.request.generator.get_state()
                  for sr, _ in verify if sr.request.generator is not None}  # fmt: skip
        rows_hidden = hidden[rows]
        # constrained rows need their masks, which need the vocabulary size of the logits
        constrained = any(sr.request.grammar is not None for sr, _ in verify)
        meta = None if constrained else SamplingMetadata.from_requests(requests, drafted)
        targets = None if meta is None else self._greedy(rows_hidden, meta)
        lps = None
        if targets is None:
            logits = self.model.compute_logits(rows_hidden)
            if meta is None:
                masks = self._draft_masks(verify, logits.shape[1])
                meta = SamplingMetadata.from_requests(requests, drafted, masks)
            out = self.sampler(logits, meta)
            targets, lps = out.sampled_token_ids.tolist(), out.logprobs
        offset = 0
        for sr, _ in verify:
            req, n = sr.request, sr.num_new_tokens
            tokens = accept_drafts(sr.spec_token_ids, targets[offset : offset + n])
            sampled[req.request_id] = tokens
            if self.keep_features:  # the state that produced the last accepted token
                features[req.request_id] = hidden[rows[offset + len(tokens) - 1]].clone()
            if req.request_id in seeded and not req.sampling_params.greedy:
                req.generator.set_state(seeded[req.request_id])
                for _ in tokens:
                    torch.rand((1, 1), generator=req.generator)
            k = req.sampling_params.logprobs
            if k is not None and lps is not None:
                logprobs[req.request_id] = [
                    _position(lps, offset + i, k) for i in range(len(tokens))
                ]
            offset += n

    def _greedy(self, hidden: torch.Tensor, meta: SamplingMetadata) -> list[int] | None:
        """The tokens of rows that all take the raw argmax, where the model computes only that
        (the sampler's tokens, bit for bit); None: sample from the logits."""
        greedy_tokens = getattr(self.model, "greedy_tokens", None)
        if greedy_tokens is None or not meta.plain_greedy:
            return None
        tokens = greedy_tokens(hidden)
        return None if tokens is None else tokens.tolist()

    @staticmethod
    def _draft_masks(
        verify: list[tuple[ScheduledRequest, int]], vocab: int
    ) -> dict[int, torch.Tensor]:
        """Constrained requests: the tokens their grammar allows at each verified position,
        the matcher advanced through the drafts before it and rolled back after."""
        masks: dict[int, torch.Tensor] = {}
        row = 0
        for sr, _ in verify:
            matcher = sr.request.grammar
            if matcher is not None:
                consumed = 0
                for i in range(sr.num_new_tokens):
                    masks[row + i] = allowed_mask([matcher], vocab)[0]
                    if i < len(sr.spec_token_ids):
                        if not matcher.consume_token(sr.spec_token_ids[i]):
                            raise RuntimeError("a draft the grammar validated was rejected")
                        consumed += 1
                if consumed:
                    matcher.rollback(consumed)
            row += sr.num_new_tokens
        return masks

    def _prompt_logprobs(self, hidden: torch.Tensor, req: Request) -> list[PositionLogprobs]:
        """Logprobs of the prompt tokens that follow each position of this chunk."""
        first = req.num_computed_tokens
        last = min(
            first + hidden.shape[0], req.num_prompt_tokens - 1
        )  # positions with a next prompt token
        k = req.sampling_params.prompt_logprobs or 0
        result: list[PositionLogprobs] = []
        for s in range(max(first, req.prompt_logprobs_upto), last, _PROMPT_LOGPROBS_SLICE):
            e = min(s + _PROMPT_LOGPROBS_SLICE, last)
            lp = self.model.compute_logits(hidden[s - first : e - first]).float().log_softmax(dim=1)
            targets = torch.tensor(req.prompt_token_ids[s + 1 : e + 1], device=lp.device)
            tensors = gather_logprobs(lp, targets, k)
            result.extend(_position(tensors, row, k) for row in range(e - s))
        req.prompt_logprobs_upto = max(req.prompt_logprobs_upto, last)
        return result


def _position(t: LogprobsTensors, row: int, k: int) -> PositionLogprobs:
    return (
        t.token_ids[row, : k + 1].tolist(),
        t.logprobs[row, : k + 1].tolist(),
        int(t.sampled_ranks[row]),
    )
