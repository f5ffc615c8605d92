"""Logits of whole token sequences on a bare model (no engine, no scheduler): what fidelity
measurements and calibration run. Sequences of one call go through the model as one batch,
each in its own run of KV blocks."""

from __future__ import annotations

import time

import torch

from tokenmill.kv.manager import cdiv
from tokenmill.model.llama import LlamaForCausalLM
from tokenmill.request import Request
from tokenmill.sampling_params import SamplingParams
from tokenmill.scheduler.output import ScheduledRequest
from tokenmill.worker.input_batch import build_model_input
from tokenmill.worker.model_runner import ModelRunner

_BLOCK_SIZE = 16


class ModelScorer:
    """Runs up to `max_sequences` sequences of up to `max_len` tokens per call."""

    def __init__(self, model: LlamaForCausalLM, max_len: int, max_sequences: int = 1) -> None:
        self.model = model
        self.blocks_per_sequence = cdiv(max_len, _BLOCK_SIZE)
        self.max_len = max_len
        self.max_sequences = max_sequences
        self.runner = ModelRunner(model, self.blocks_per_sequence * max_sequences, _BLOCK_SIZE)

    @torch.inference_mode()
    def hidden_states(self, sequences: list[list[int]]) -> list[torch.Tensor]:
        """The last layer's hidden states [len(seq), hidden] of each sequence."""
        if len(sequences) > self.max_sequences or any(
            not 0 < len(s) <= self.max_len for s in sequences
        ):
            raise ValueError("sequences exceed what this scorer was sized for")
        scheduled = []
        for i, ids in enumerate(sequences):
            req = Request(f"score-{i}", ids, SamplingParams(max_tokens=1), [], self.max_len + 1)
            first = i * self.blocks_per_sequence
            blocks = list(range(first, first + cdiv(len(ids), _BLOCK_SIZE)))
            scheduled.append(ScheduledRequest(req, len(ids), blocks))
        model = self.model
        inp = build_model_input(scheduled, _BLOCK_SIZE)
        hidden = model.forward(
            inp.input_ids, inp.positions, self.runner.kv_caches, self.runner.attn, inp.attn_metadata
        )
        # build_model_input puts single-token sequences first: map rows back to our order
        rows, out = 0, {}
        for sr in inp.ordered:
            n = sr.num_new_tokens
            out[sr.request.request_id] = hidden[rows : rows + n]
            rows += n
        return [out[f"score-{i}"] for i in range(len(sequences))]

    @torch.inference_mode()
    def log_probs(self, sequences: list[list[int]], first: int = 0) -> list[torch.Tensor]:
        """log-softmax of the logits at positions first.. of each sequence (float32)."""
        return [
            self.model.compute_logits(h[first:].contiguous()).float().log_softmax(-1)
            for h in self.hidden_states(sequences)
        ]

    @torch.inference_mode()
    def decode_speed(self, prompt: list[int], steps: int) -> float:
        """Single-stream greedy decode: tokens per second over `steps` tokens after the
        prompt (one request, no batching, the engine's model and attention path)."""
        if len(prompt) + steps > self.max_len:
            raise ValueError("prompt + steps exceed what this scorer was sized for")
        model = self.model
        req = Request("speed", prompt, SamplingParams(max_tokens=steps), [], self.max_len + 1)
        blocks = list(range(self.blocks_per_sequence))
        n = len(prompt)
        t0 = 0.0
        for step in range(steps + 1):
            if step == 1:
                t0 = time.perf_counter()
            sr = ScheduledRequest(req, n, blocks)
            inp = build_model_input([sr], _BLOCK_SIZE)
            hidden = model.forward(
                inp.input_ids, inp.positions, self.runner.kv_caches, self.runner.attn,
                inp.attn_metadata,
            )  # fmt: skip
            token = int(model.compute_logits(hidden[-1:]).argmax())
            req.num_computed_tokens += n
            req.append_output_token(token)
            n = 1
        return steps / (time.perf_counter() - t0)
