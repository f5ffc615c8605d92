"""Runs one scheduler step: flat batch -> forward -> logits of sampled rows -> tokens."""

from __future__ import annotations

import torch

from tokenmill.engine.core_types import PositionLogprobs
from tokenmill.model.attention import AttentionBackend, get_attention_backend
from tokenmill.model.llama import LlamaForCausalLM
from tokenmill.request import Request
from tokenmill.sampling.metadata import SamplingMetadata
from tokenmill.sampling.sampler import LogprobsTensors, Sampler, gather_logprobs
from tokenmill.scheduler.scheduler import ModelRunnerOutput, ScheduledRequest, SchedulerOutput
from tokenmill.spec.verify import accept_greedy
from tokenmill.worker.input_batch import build_model_input

# Prompt-logprob rows are turned into log-softmax in slices of this many positions.
_PROMPT_LOGPROBS_SLICE = 256


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
    ) -> None:
        cfg = model.config
        self.model = model
        self.block_size = block_size
        self.attn: AttentionBackend = get_attention_backend(attention_backend)(
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
        self.sampler = Sampler()

    def read_block(self, block_id: int) -> torch.Tensor:
        """One block's K and V for every layer: [num_layers, 2, block_numel] (a copy)."""
        return torch.stack([kv[:, block_id] for kv in self.kv_caches])

    def write_block(self, block_id: int, data: torch.Tensor) -> None:
        for layer, kv in enumerate(self.kv_caches):
            kv[:, block_id].copy_(data[layer])

    @torch.inference_mode()
    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        inp = build_model_input(sched.scheduled, self.block_size, self.model.config.sliding_window)
        hidden = self.model.forward(
            inp.input_ids, inp.positions, self.kv_caches, self.attn, inp.attn_metadata
        )

        sample_rows: list[int] = []
        sample_reqs: list[Request] = []
        verify: list[tuple[ScheduledRequest, int]] = []
        prompt_lp: dict[str, list[PositionLogprobs]] = {}
        for sr, start in zip(inp.ordered, inp.query_starts, strict=True):
            req = sr.request
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
        if verify:
            sampled.update(self._verify(hidden, verify))
        if sample_reqs:
            logits = self.model.compute_logits(hidden[sample_rows])
            out = self.sampler(logits, SamplingMetadata.from_requests(sample_reqs))
            tokens = out.sampled_token_ids.tolist()
            for row, req in enumerate(sample_reqs):
                sampled[req.request_id] = [tokens[row]]
                k = req.sampling_params.logprobs
                if k is not None and out.logprobs is not None:
                    logprobs[req.request_id] = [_position(out.logprobs, row, k)]
        return ModelRunnerOutput(sampled, logprobs, prompt_lp)

    def _verify(
        self, hidden: torch.Tensor, verify: list[tuple[ScheduledRequest, int]]
    ) -> dict[str, list[int]]:
        """Greedy verification of drafts: the target's argmax at every drafted position (the
        sampler's greedy choice for these plain requests, from the same logits)."""
        rows = [start + i for sr, start in verify for i in range(sr.num_new_tokens)]
        targets = self.model.compute_logits(hidden[rows]).float().max(dim=1).indices.tolist()
        out: dict[str, list[int]] = {}
        offset = 0
        for sr, _ in verify:
            n = sr.num_new_tokens
            out[sr.request.request_id] = accept_greedy(
                sr.spec_token_ids, targets[offset : offset + n]
            )
            offset += n
        return out

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
            targets = torch.tensor(req.prompt_token_ids[s + 1 : e + 1], dtype=torch.long)
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
