"""Drafts from a trained draft head (draft_head.py), fed by the target's last hidden state."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tokenmill.model.linear import PackedLinear
from tokenmill.model.packed import PackedWeight
from tokenmill.spec.draft_head import DraftHead, TargetReadout, load_draft_head, target_fingerprint


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
    """The lm_head's draft-vocabulary rows as a packed layer of their own (same kernel)."""
    w = getattr(lm_head, "weight", None)
    if not isinstance(lm_head, PackedLinear) or not isinstance(w, PackedWeight):
        return None
    rows = PackedWeight(w.qtype, draft_vocab.numel(), w.cols, w.data[draft_vocab].contiguous())
    return PackedLinear(rows, None)


def model_fingerprint(model) -> str:
    return target_fingerprint(model.embed_tokens, model.norm)


class DraftHeadProposer:
    name = "draft_head"
    needs_features = True  # the model runner keeps each request's last hidden state

    def __init__(self, head: DraftHead, readout: TargetReadout, k: int) -> None:
        self.head = head
        self.readout = readout
        self.k = k

    @classmethod
    def from_file(cls, path: str, model, k: int) -> DraftHeadProposer:
        cfg = model.config
        head, _ = load_draft_head(path, model_fingerprint(model), cfg.hidden_size, cfg.vocab_size)
        return cls(head, target_readout(model, head.draft_vocab), k)

    @torch.inference_mode()
    def propose(
        self, token_ids: Sequence[int], max_tokens: int, feature: torch.Tensor | None = None
    ) -> list[int]:
        if feature is None or max_tokens <= 0 or not token_ids:
            return []
        drafts: list[int] = []
        token = token_ids[-1]
        for _ in range(min(self.k, max_tokens)):
            feature = self.head.step(feature, self.readout.embed_tokens[token].float())
            logits = self.head.draft_logits(feature, self.readout)
            token = int(self.head.draft_vocab[int(logits.argmax())])
            drafts.append(token)
        return drafts
