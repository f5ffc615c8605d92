"""A draft head's k drafts in one native call (kernels/csrc/draft_chain.c): the packed
head's layers, the target's embedding table, final norm and packed lm_head rows, read by
pointer. Available where the head and the readout both run the integer-dot GEMV."""

from __future__ import annotations

import ctypes

import torch

from tokenmill.kernels.build import load_kernels
from tokenmill.model.fused_decode import Projection, projection_of, runs_int_dot

_i64, _f32, _ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
HEAD_EPS = 1e-6  # draft_head.rms's default


class DraftChainWeights(ctypes.Structure):
    _fields_ = [
        *((name, _i64) for name in ("hidden", "intermediate", "vocab", "draft_vocab")),
        ("head_eps", _f32),
        ("target_eps", _f32),
        *((name, _ptr) for name in ("feature_norm", "embed_norm", "final_norm", "embed_tokens")),
        ("draft_vocab_ids", _ptr),
        *((name, Projection) for name in ("fc", "gate_up", "down", "readout")),
    ]


class NativeDraftChain:
    """DraftHeadProposer's drafting loop (PackedDraftHead.step, the readout, argmax) as one
    call; the tensors it points into are kept alive here."""

    def __init__(self, packed_head, head, readout) -> None:
        self._keep = (
            head.feature_norm.detach().float().contiguous(),
            head.embed_norm.detach().float().contiguous(),
            readout.final_norm.float().contiguous(),
            readout.embed_tokens.contiguous(),
            head.draft_vocab.long().contiguous(),
        )
        feature_norm, embed_norm, final_norm, embed, vocab_ids = self._keep
        self.hidden = head.hidden_size
        self.weights = DraftChainWeights(
            head.hidden_size,
            head.intermediate_size,
            embed.shape[0],
            vocab_ids.numel(),
            HEAD_EPS,
            readout.eps,
            feature_norm.data_ptr(),
            embed_norm.data_ptr(),
            final_norm.data_ptr(),
            embed.data_ptr(),
            vocab_ids.data_ptr(),
            projection_of(packed_head.fc),
            projection_of(packed_head.gate_up),
            projection_of(packed_head.down),
            projection_of(readout.packed_rows),
        )
        self._lib = load_kernels()

    @staticmethod
    def supported(packed_head, readout) -> bool:
        layers = (packed_head.fc, packed_head.gate_up, packed_head.down, readout.packed_rows)
        return (
            readout.embed_tokens.dtype == torch.float32
            and readout.embed_tokens.is_contiguous()
            and all(runs_int_dot(layer) for layer in layers)
        )

    def draft(
        self, feature: torch.Tensor, token: int, k: int, min_chain_prob: float = 0.0
    ) -> tuple[list[int], list[float]]:
        """Up to k drafts after `token`, from the target's hidden state `feature` ([H]), and
        the head's probability of each; the chain stops before the product of those
        probabilities falls below `min_chain_prob`."""
        f = feature.detach().float().reshape(self.hidden).clone()
        out = torch.empty(k, dtype=torch.int64)
        probs = torch.empty(k, dtype=torch.float32)
        n = self._lib.tm_draft_chain(
            ctypes.addressof(self.weights),
            f.data_ptr(),
            token,
            k,
            out.data_ptr(),
            probs.data_ptr(),
            min_chain_prob,
            torch.get_num_threads(),
        )
        return out[:n].tolist(), probs[:n].tolist()
