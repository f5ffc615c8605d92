"""Drafts from a trained draft head (draft_head.py), fed by the target's last hidden state."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tokenmill.kernels import ops
from tokenmill.model.linear import PackedLinear
from tokenmill.model.packed import PackedWeight
from tokenmill.spec.draft_head import (
    DraftHead,
    TargetReadout,
    load_draft_head,
    rms,
    target_fingerprint,
)
from tokenmill.spec.drafts import Drafts
from tokenmill.spec.native_chain import NativeDraftChain
from tokenmill.spec.state import SpecState


def target_readout(model, draft_vocab: torch.Tensor) -> TargetReadout:
    """The target's embedding table, final norm and lm_head rows for the draft vocabulary
    (any weight format: the rows are read back through the lm_head itself)."""
    hidden = model.config.hidden_size
    with torch.inference_mode():
        if model.config.tie_word_embeddings:
            rows = model.embed_tokens[draft_vocab].float()
        else:
            rows = model.lm_head(torch.eye(hidden)).float()[:, draft_vocab].t()
    return TargetReadout(
        model.embed_tokens,
        model.norm.float(),
        rows.contiguous(),
        model.config.rms_norm_eps,
        _packed_rows(model.lm_head, draft_vocab),
    )


def _packed_rows(lm_head, draft_vocab: torch.Tensor) -> PackedLinear | None:
    """The lm_head's draft-vocabulary rows as a packed layer of their own (same kernel), padded
    with copies of the last row to a multiple of 16 (the integer-dot GEMV's row groups; a draft
    vocabulary holds as many ids as the training traffic had, 3,652 say): callers keep the
    first len(draft_vocab) outputs."""
    w = getattr(lm_head, "weight", None)
    if not isinstance(lm_head, PackedLinear) or not isinstance(w, PackedWeight):
        return None
    n = draft_vocab.numel()
    ids = torch.cat([draft_vocab, draft_vocab[-1:].expand(-n % 16)])
    rows = PackedWeight(w.qtype, ids.numel(), w.cols, w.data[ids].contiguous())
    return PackedLinear(rows, None, activation_bits=lm_head.activation_bits)  # the lm_head's


class PackedDraftHead:
    """The head's layers for drafting: Q8_0 blocks through the integer-dot GEMV (a quarter of
    the float32 bytes, which a draft reads once per token: 10.6 MB at the embedded model's
    width, ~0.3 ms from L3). Drafts only propose, so the rounding (~0.4% of the predicted
    feature) costs at most a draft now and then, never an output token."""

    def __init__(self, head: DraftHead) -> None:
        from tokenmill.quant.formats import quantize_weight

        def packed(w: torch.Tensor, bias: torch.Tensor | None = None) -> PackedLinear:
            return PackedLinear(quantize_weight(w.detach(), "q8_0"), bias)

        self.intermediate = head.intermediate_size
        self.fc = packed(head.fc.weight, head.fc.bias.detach().float())
        self.gate_up = packed(torch.cat([head.gate.weight, head.up.weight]))
        self.down = packed(head.down.weight)
        self.feature_norm = head.feature_norm.detach().float()
        self.embed_norm = head.embed_norm.detach().float()

    @staticmethod
    def supported(head: DraftHead) -> bool:
        if not ops.kernels_available() or ops.int_dot_kind() == 0:
            return False
        h, i = head.hidden_size, head.intermediate_size
        return h % 32 == 0 and i % 32 == 0  # Q8_0 blocks, int-dot row groups of 16

    def step(self, feature: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """DraftHead.step for one position ([H] tensors)."""
        x = torch.cat([rms(feature) * self.feature_norm, rms(embedding) * self.embed_norm])
        h = self.fc(x.unsqueeze(0))
        gate_up = self.gate_up(h)
        act = torch.nn.functional.silu(gate_up[:, : self.intermediate])
        act.mul_(gate_up[:, self.intermediate :])
        return self.down(act, h)[0]  # h + down(act), accumulated in place


def model_fingerprint(model) -> str:
    return target_fingerprint(model.embed_tokens, model.norm)


class DraftHeadProposer:
    name = "draft_head"
    needs_features = True  # the model runner keeps each request's last hidden state
    scores_drafts = True  # each draft's probability under the head

    def __init__(self, head: DraftHead, readout: TargetReadout, k: int) -> None:
        self.head = head
        self.readout = readout
        self.k = k
        self.packed = PackedDraftHead(head) if PackedDraftHead.supported(head) else None
        # the whole chain in one native call where every layer runs the integer-dot GEMV
        self.chain = None
        if self.packed is not None and NativeDraftChain.supported(self.packed, readout):
            self.chain = NativeDraftChain(self.packed, head, readout)

    @classmethod
    def from_file(cls, path: str, model, k: int) -> DraftHeadProposer:
        cfg = model.config
        head, _ = load_draft_head(path, model_fingerprint(model), cfg.hidden_size, cfg.vocab_size)
        return cls(head, target_readout(model, head.draft_vocab), k)

    def draft(
        self, token_ids: Sequence[int], state: SpecState, max_tokens: int,
        min_chain_prob: float = 0.0,
    ) -> Drafts:  # fmt: skip
        """The Proposer protocol: a chain from the request's last hidden state."""
        drafts, probs = self.propose_scored(token_ids, max_tokens, state.feature, min_chain_prob)
        return Drafts(drafts, probs)

    @torch.inference_mode()
    def propose_scored(
        self,
        token_ids: Sequence[int],
        max_tokens: int,
        feature: torch.Tensor | None = None,
        min_chain_prob: float = 0.0,
    ) -> tuple[list[int], list[float]]:
        """Drafts and the head's probability of each (softmax over the draft vocabulary at
        its pick); the chain stops before the product of the probabilities falls below
        `min_chain_prob`."""
        if feature is None or max_tokens <= 0 or not token_ids:
            return [], []
        k = min(self.k, max_tokens)
        if self.chain is not None:
            return self.chain.draft(feature, token_ids[-1], k, min_chain_prob)
        drafts: list[int] = []
        probs: list[float] = []
        token, chain = token_ids[-1], 1.0
        step = self.packed.step if self.packed is not None else self.head.step
        for _ in range(k):
            feature = step(feature, self.readout.embed_tokens[token].float())
            logits = self.head.draft_logits(feature, self.readout)
            best = int(logits.argmax())
            p = float(torch.softmax(logits.float(), -1)[best])
            chain *= p
            if chain < min_chain_prob or not torch.isfinite(logits[best]):
                break
            token = int(self.head.draft_vocab[best])
            drafts.append(token)
            probs.append(p)
        return drafts, probs
