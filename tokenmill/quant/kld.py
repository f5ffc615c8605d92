"""KL divergence of a model's next-token distributions from a reference's, measured the way
llama.cpp's `llama-perplexity --kl-divergence` does, so the two tools' figures sit side by
side: the text is cut into chunks of `ctx` tokens (the first replaced by BOS where the
model has one), and only the second half of each chunk is scored (every position there has
at least ctx/2 tokens of context). Reported: mean / median / p99 / max KLD, how often the top
token agrees, the RMS difference of the probability of the actual next token (Δp), and the
perplexity of both."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tokenmill.quant.scoring import ModelScorer


@dataclass(frozen=True)
class EvalChunks:
    chunks: list[list[int]]
    ctx: int

    @property
    def first(self) -> int:
        """The first scored position of each chunk."""
        return self.ctx // 2

    @property
    def num_scored(self) -> int:
        return len(self.chunks) * (self.ctx - 1 - self.first)


def make_chunks(
    token_ids: list[int], ctx: int, max_chunks: int | None, bos_token_id: int | None
) -> EvalChunks:
    if ctx < 8:
        raise ValueError("ctx: at least 8 tokens")
    n = len(token_ids) // ctx
    if max_chunks is not None:
        n = min(n, max_chunks)
    if n == 0:
        raise ValueError(f"the text has {len(token_ids)} tokens, fewer than one chunk of {ctx}")
    chunks = []
    for i in range(n):
        chunk = list(token_ids[i * ctx : (i + 1) * ctx])
        if bos_token_id is not None:
            chunk[0] = bos_token_id
        chunks.append(chunk)
    return EvalChunks(chunks, ctx)


@dataclass
class ScoredLogProbs:
    """log-probabilities at the scored positions of every chunk, and the next tokens."""

    log_probs: torch.Tensor  # [num_scored, vocab]
    targets: torch.Tensor  # [num_scored]


def score(
    scorer: ModelScorer,
    chunks: EvalChunks,
    batch: int | None = None,
    on_scored: Callable[[int], None] | None = None,
) -> ScoredLogProbs:
    """`on_scored(n)` after each batch of n chunks (progress)."""
    batch = batch or scorer.max_sequences
    parts = []
    for start in range(0, len(chunks.chunks), batch):
        seqs = chunks.chunks[start : start + batch]
        for lp in scorer.log_probs(seqs, first=chunks.first):
            parts.append(lp[:-1])  # the last position has no next token in the chunk
        if on_scored is not None:
            on_scored(len(seqs))
    targets = torch.tensor(
        [t for c in chunks.chunks for t in c[chunks.first + 1 :]], dtype=torch.int64
    )
    return ScoredLogProbs(torch.cat(parts), targets)


@dataclass(frozen=True)
class KLDReport:
    num_tokens: int
    mean_kld: float
    mean_kld_stderr: float
    median_kld: float
    p99_kld: float
    max_kld: float
    same_top_pct: float
    rms_dp_pct: float
    ppl_ref: float
    ppl_test: float

    @property
    def ln_ppl_ratio(self) -> float:
        return math.log(self.ppl_test / self.ppl_ref)

    def lines(self) -> list[str]:
        """llama-perplexity's report lines."""
        return [
            f"tokens scored          {self.num_tokens}",
            f"Mean PPL(Q)            {self.ppl_test:.4f}",
            f"Mean PPL(base)         {self.ppl_ref:.4f}",
            f"Mean ln(PPL(Q)/PPL(base)) {self.ln_ppl_ratio:+.6f}",
            f"Mean    KLD            {self.mean_kld:.6f} ± {self.mean_kld_stderr:.6f}",
            f"Maximum KLD            {self.max_kld:.6f}",
            f"99.0%   KLD            {self.p99_kld:.6f}",
            f"Median  KLD            {self.median_kld:.6f}",
            f"RMS Δp                 {self.rms_dp_pct:.3f} %",
            f"Same top p             {self.same_top_pct:.3f} %",
        ]

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def kld_report(ref: ScoredLogProbs, test: ScoredLogProbs) -> KLDReport:
    ref_lp, test_lp, targets = ref.log_probs, test.log_probs, ref.targets
    kl = (ref_lp.exp() * (ref_lp - test_lp)).sum(-1).clamp_min(0.0).double()
    same_top = (ref_lp.argmax(-1) == test_lp.argmax(-1)).double().mean().item()
    p_ref = ref_lp.gather(1, targets[:, None]).squeeze(1).double()
    p_test = test_lp.gather(1, targets[:, None]).squeeze(1).double()
    dp = p_test.exp() - p_ref.exp()
    n = kl.numel()
    return KLDReport(
        num_tokens=n,
        mean_kld=kl.mean().item(),
        mean_kld_stderr=(kl.std().item() / math.sqrt(n)) if n > 1 else 0.0,
        median_kld=kl.median().item(),
        p99_kld=kl.quantile(0.99).item(),
        max_kld=kl.max().item(),
        same_top_pct=100 * same_top,
        rms_dp_pct=100 * dp.pow(2).mean().sqrt().item(),
        ppl_ref=math.exp(-p_ref.mean().item()),
        ppl_test=math.exp(-p_test.mean().item()),
    )


def eval_tokens(tokenizer, text: str) -> tuple[list[int], int | None]:
    """The text's tokens as llama-perplexity reads them (BOS first where the model adds one)
    and the BOS id that starts every chunk (None: the model adds none)."""
    bos = tokenizer.bos_token_id if tokenizer.add_bos_token else None
    return tokenizer.encode(text), bos
