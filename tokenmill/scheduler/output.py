"""The step's data between the scheduler and the model runner (vLLM's
core/sched/output.py and v1/outputs.py): what runs this step, and what it produced."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tokenmill.messages import PositionLogprobs
from tokenmill.request import Request


@dataclass
class ScheduledRequest:
    request: Request
    num_new_tokens: int  # with drafts: 1 + len(spec_token_ids)
    block_ids: list[int]
    spec_token_ids: list[int] = field(default_factory=list)  # drafts verified this step

    @property
    def samples(self) -> bool:
        """This step reaches the end of the request's known tokens, so it yields a new token."""
        return self.request.num_computed_tokens + self.num_new_tokens >= self.request.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    num_scheduled_tokens: int = 0
    preempted_request_ids: list[str] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def is_decode_only(self) -> bool:
        """Every request runs one new token (plus its drafts): no prefill in this step."""
        return all(sr.num_new_tokens == 1 + len(sr.spec_token_ids) for sr in self.scheduled)


@dataclass
class ModelRunnerOutput:
    sampled_token_ids: dict[str, list[int]]
    logprobs: dict[str, list[PositionLogprobs]]
    prompt_logprobs: dict[str, list[PositionLogprobs]]
    # the hidden state behind each request's last sampled token, when a proposer drafts
    # from it (ModelRunner.keep_features)
    features: dict[str, torch.Tensor] = field(default_factory=dict)
    # pooling requests whose prompt completed this step: their vector
    pooled: dict[str, list[float]] = field(default_factory=dict)
