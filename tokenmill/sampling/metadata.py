"""Per-step sampling inputs for the rows that get a token, gathered from their requests."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from tokenmill.request import Request


@dataclass
class SamplingMetadata:
    temperature: torch.Tensor  # [S]; 0 for greedy rows
    all_greedy: bool
    any_greedy: bool  # some row is greedy (its first largest logit wins)
    scaled: bool  # some random row's temperature is not 1 (its logits are divided by it)
    top_k: torch.Tensor | None  # [S] long, 0 = off
    top_p: torch.Tensor | None  # [S]
    min_p: torch.Tensor | None  # [S]
    generators: dict[int, torch.Generator]  # row -> per-request generator (seeded requests)
    # penalties (None when no row uses them)
    presence_penalty: torch.Tensor | None
    frequency_penalty: torch.Tensor | None
    repetition_penalty: torch.Tensor | None
    output_token_ids: list[list[int]]
    prompt_token_ids: list[list[int]]
    # rows that may not stop yet (min_tokens): row -> token ids to suppress
    blocked_tokens: dict[int, list[int]]
    logit_bias: dict[int, dict[int, float]]
    max_num_logprobs: int | None  # None: no row wants logprobs
    grammars: dict[int, object]  # row -> llguidance matcher (constrained rows)
    # row -> allowed tokens, computed by the caller (verification: the matcher's state after
    # the drafts before the row); other constrained rows ask their matcher
    grammar_masks: dict[int, torch.Tensor]
    closing: dict[
        int, list[int]
    ]  # constrained rows that should close their output -> output so far

    def to(self, device: torch.device) -> SamplingMetadata:
        """These rows' tensors on `device` (itself where they are there already)."""
        if self.temperature.device == device:
            return self
        moved = {
            name: getattr(self, name).to(device, non_blocking=True)
            for name in ("temperature", "top_k", "top_p", "min_p", "presence_penalty",
                         "frequency_penalty", "repetition_penalty")
            if getattr(self, name) is not None
        }  # fmt: skip
        return dataclasses.replace(self, **moved)

    @property
    def plain_greedy(self) -> bool:
        """Every row takes the first largest raw logit: nothing biases, masks, penalizes or
        reads the logits (the model may then compute only their argmax)."""
        return (
            self.all_greedy
            and self.max_num_logprobs is None
            and not self.logit_bias
            and not self.blocked_tokens
            and not self.grammars
            and self.presence_penalty is None
        )

    @classmethod
    def from_requests(
        cls,
        requests: list[Request],
        drafted: list[list[int]] | None = None,
        grammar_masks: dict[int, torch.Tensor] | None = None,
    ) -> SamplingMetadata:
        """One row per entry of `requests`. With `drafted` (speculative verification), row i
        samples after the request's output plus drafted[i], the drafts before its position:
        penalties see them and min_tokens counts them; a request may then fill several rows.
        Tokens banned for the next step apply to a request's row without drafts."""
        drafted = drafted or [[] for _ in requests]
        params = [r.sampling_params for r in requests]
        temperature = torch.tensor(
            [0.0 if p.greedy else p.temperature for p in params], dtype=torch.float32
        )
        all_greedy = all(p.greedy for p in params)
        any_greedy = any(p.greedy for p in params)
        scaled = any(not p.greedy and p.temperature != 1.0 for p in params)
        top_k = top_p = min_p = None
        if not all_greedy:
            if any(p.top_k > 0 for p in params):
                top_k = torch.tensor([p.top_k for p in params], dtype=torch.long)
            if any(p.top_p < 1.0 for p in params):
                top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32)
            if any(p.min_p > 0 for p in params):
                min_p = torch.tensor([p.min_p for p in params], dtype=torch.float32)
        generators = {i: r.generator for i, r in enumerate(requests) if r.generator is not None}
        presence = frequency = repetition = None
        outputs: list[list[int]] = []
        if any(p.uses_penalties for p in params):
            presence = torch.tensor([p.presence_penalty for p in params], dtype=torch.float32)
            frequency = torch.tensor([p.frequency_penalty for p in params], dtype=torch.float32)
            repetition = torch.tensor([p.repetition_penalty for p in params], dtype=torch.float32)
            outputs = [r.output_token_ids + d for r, d in zip(requests, drafted, strict=True)]
        blocked = {
            i: sorted(r.stop_token_ids)
            for i, (r, d) in enumerate(zip(requests, drafted, strict=True))
            if r.num_output_tokens + len(d) < r.sampling_params.min_tokens and r.stop_token_ids
        }
        for i, (r, d) in enumerate(zip(requests, drafted, strict=True)):
            if r.banned_next and not d:
                blocked[i] = blocked.get(i, []) + r.banned_next
                r.banned_next = []
        bias = {i: p.logit_bias for i, p in enumerate(params) if p.logit_bias}
        wanted = [p.logprobs for p in params if p.logprobs is not None]
        return cls(
            temperature=temperature,
            all_greedy=all_greedy,
            any_greedy=any_greedy,
            scaled=scaled,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            generators=generators,
            presence_penalty=presence,
            frequency_penalty=frequency,
            repetition_penalty=repetition,
            output_token_ids=outputs,
            prompt_token_ids=[r.prompt_token_ids for r in requests] if presence is not None else [],
            blocked_tokens=blocked,
            logit_bias=bias,
            max_num_logprobs=max(wanted) if wanted else None,
            grammars={i: r.grammar for i, r in enumerate(requests) if r.grammar is not None},
            grammar_masks=grammar_masks or {},
            closing={
                i: r.output_token_ids
                for i, (r, d) in enumerate(zip(requests, drafted, strict=True))
                if r.grammar is not None and r.closing and not d
            },
        )
