"""Turns logits into tokens: bias and bans, penalties, temperature, top-k/top-p/min-p, seeded draws,
and the logprobs of what was drawn."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from tokenmill.sampling.metadata import SamplingMetadata
from tokenmill.sampling.penalties import apply_penalties
from tokenmill.structured.closing import EOS, next_closer, path_to_close
from tokenmill.structured.token_mask import allowed_mask

if TYPE_CHECKING:
    from tokenmill.structured.manager import StructuredOutputManager


@dataclass
class LogprobsTensors:
    token_ids: torch.Tensor  # [S, k + 1]: sampled token first, then the top-k
    logprobs: torch.Tensor  # [S, k + 1]
    sampled_ranks: torch.Tensor  # [S]: 1-based rank of the sampled token


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [S]
    logprobs: LogprobsTensors | None


def gather_logprobs(logprobs: torch.Tensor, token_ids: torch.Tensor, k: int) -> LogprobsTensors:
    """The chosen tokens' logprobs, their ranks and the top-k alternatives."""
    chosen = logprobs.gather(1, token_ids.unsqueeze(1))
    ranks = (logprobs > chosen).sum(dim=1) + 1
    if k > 0:
        top_lp, top_ids = logprobs.topk(k, dim=1)
        ids = torch.cat([token_ids.unsqueeze(1), top_ids], dim=1)
        lps = torch.cat([chosen, top_lp], dim=1)
    else:
        ids, lps = token_ids.unsqueeze(1), chosen
    return LogprobsTensors(ids, lps, ranks)


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    vocab = logits.shape[1]
    if top_p is None:
        if top_k is None:
            return logits
        k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
        max_k = int(k.max())
        top_values = logits.topk(max_k, dim=1).values
        threshold = top_values.gather(1, (k - 1).unsqueeze(1))
        threshold[k == vocab] = float("-inf")
        return logits.masked_fill(logits < threshold, float("-inf"))
    logits_sort, order = logits.sort(dim=1, descending=False)
    if top_k is not None:
        k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
        kth = logits_sort.gather(1, (vocab - k).unsqueeze(1))
        logits_sort.masked_fill_(logits_sort < kth, float("-inf"))
    probs_sort = logits_sort.softmax(dim=1)
    cumulative = probs_sort.cumsum(dim=1)
    remove = cumulative <= (1 - top_p.unsqueeze(1))
    remove[:, -1] = False  # keep at least the most likely token
    logits_sort.masked_fill_(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, logits_sort)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    probs = logits.softmax(dim=1)
    threshold = probs.amax(dim=1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, float("-inf"))


def first_max(logits: torch.Tensor) -> torch.Tensor:
    """Per row, the index of its largest logit, the first on ties (max is faster than argmax
    on CPU)."""
    return logits.max(dim=1).indices


def inverse_cdf_sample(probs: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row drawn from `probs` (rows need not be normalized): the first token
    whose cumulative probability exceeds u · total, which always has a probability > 0.
    `u` ([rows, 1] uniforms in [0, 1)) defaults to fresh draws from the global generator."""
    cdf = probs.cumsum(dim=1)
    total = cdf[:, -1:]
    if u is None:
        u = torch.rand(total.shape, dtype=cdf.dtype, device=cdf.device)
    sampled = torch.searchsorted(cdf, u.to(cdf) * total, right=True).squeeze(1)
    # u · total rounds up to total only with probability ~1e-7; take the likeliest token then.
    overflow = sampled >= probs.shape[1]
    if overflow.any():
        sampled = torch.where(overflow, probs.argmax(dim=1), sampled)
    return sampled


class Sampler:
    def __init__(self, structured: StructuredOutputManager | None = None) -> None:
        # its closing tokens (set once constrained requests exist): what closing rows prefer
        self.structured = structured

    def __call__(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        logits = logits.float()
        meta = meta.to(logits.device)
        raw_logprobs = logits.log_softmax(dim=1) if meta.max_num_logprobs is not None else None

        if meta.logit_bias or meta.blocked_tokens:
            logits = logits.clone()
            for row, bias in meta.logit_bias.items():
                ids = torch.tensor(list(bias.keys()), dtype=torch.long, device=logits.device)
                logits[row, ids] += torch.tensor(list(bias.values()), device=logits.device)
            for row, banned in meta.blocked_tokens.items():
                logits[row, banned] = float("-inf")
        if meta.grammars:
            logits = self._apply_grammars(logits, meta)
        if meta.presence_penalty is not None:
            logits = apply_penalties(
                logits,
                meta.prompt_token_ids,
                meta.output_token_ids,
                meta.presence_penalty,
                meta.frequency_penalty,
                meta.repetition_penalty,
            )

        if meta.all_greedy:
            sampled = first_max(logits)
        else:
            sampled = self._random(logits, meta)
            if meta.any_greedy:
                sampled = torch.where(meta.temperature == 0, first_max(logits), sampled)

        lp = None
        if raw_logprobs is not None:
            lp = gather_logprobs(raw_logprobs, sampled, meta.max_num_logprobs or 0)
        return SamplerOutput(sampled, lp)

    def _apply_grammars(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        rows = list(meta.grammars)
        ask = [row for row in rows if row not in meta.grammar_masks]
        allowed = torch.empty(len(rows), logits.shape[1], dtype=torch.bool)
        if ask:
            asked = allowed_mask([meta.grammars[row] for row in ask], logits.shape[1])
            allowed[[rows.index(row) for row in ask]] = asked
        for r, row in enumerate(rows):
            if row in meta.grammar_masks:
                allowed[r] = meta.grammar_masks[row]
        closing = self.structured.closing if self.structured is not None else None
        if meta.closing and closing is not None:
            # Closing rows: among what the grammar allows, the tokens that finish soonest.
            for row, output in meta.closing.items():
                r = rows.index(row)
                want = next_closer(closing.decode(output))
                if want is None:
                    continue
                ids = closing.eos_ids if want == EOS else closing.closers[want]
                preferred = torch.zeros_like(allowed[r])
                preferred[ids] = True
                preferred &= allowed[r]
                if not preferred.any() and want == '"':  # the string cannot end yet
                    step = path_to_close(meta.grammars[row], closing.char_tokens, want)
                    if step is not None:
                        preferred[step] = True
                if preferred.any():
                    allowed[r] = preferred
        allowed = allowed.to(logits.device)
        constrained = logits[rows].masked_fill(~allowed, float("-inf"))
        # A ban (min_tokens, logit_bias) can leave nothing the grammar allows: the grammar wins.
        dead = torch.isinf(constrained).all(dim=1)
        if dead.any():
            logits_dead = torch.zeros_like(constrained[dead]).masked_fill_(
                ~allowed[dead], float("-inf")
            )
            constrained[dead] = logits_dead
        logits = logits.clone()
        logits[rows] = constrained
        return logits

    def _random(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        if meta.scaled:  # (a division by 1 changes nothing)
            temperature = torch.where(
                meta.temperature == 0, torch.ones_like(meta.temperature), meta.temperature
            )
            logits = logits / temperature.unsqueeze(1)
        logits = apply_top_k_top_p(logits, meta.top_k, meta.top_p)
        if meta.min_p is not None:
            logits = apply_min_p(logits, meta.min_p)
        probs = logits.softmax(dim=1)
        # Unseeded rows: inverse-CDF draws, one uniform per row (torch's exponential_ over
        # the whole [rows, vocab] grid, the usual race, costs ~1 ms per row on CPU).
        sampled = inverse_cdf_sample(probs)
        # Seeded rows: one uniform from the request's own generator per token, in row order
        # (reproducible whatever else is in the batch, and the same token whether it was
        # drafted or not: speculative verification draws exactly these).
        for row, gen in meta.generators.items():
            u = torch.rand((1, 1), generator=gen).to(probs.device)
            sampled[row] = inverse_cdf_sample(probs[row : row + 1], u)[0]
        return sampled
