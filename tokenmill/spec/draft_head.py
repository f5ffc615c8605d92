"""A draft head, EAGLE-style: a small network on the target's last hidden state and the next
token's embedding that predicts the following hidden state, read out through the target's own
lm_head (its rows for a frequent-token draft vocabulary), drafting k tokens as a chain.

    feature f_t (the target's last decoder layer output at position t, before the final norm)
    token x_{t+1} (the token sampled from f_t)
    h      = fc([rmsnorm(f_t) * w_f ; embed(x_{t+1}) * w_e])          2H -> H
    f_t+1^ = h + down(silu(gate(h)) * up(h))                          the predicted feature
    logits = lm_head[draft_vocab] @ (rmsnorm(f_t+1^) * final_norm)    the target's own readout

The next draft feeds f_t+1^ and the drafted token back in. No attention, so the head keeps no
KV cache; the draft vocabulary (the most frequent tokens of the training traffic, 4096 by
default) keeps the readout a small fraction of the target's lm_head.

File format (safetensors): tensors `fc.weight` [H, 2H], `fc.bias` [H], `feature_norm` [H],
`embed_norm` [H], `gate.weight` / `up.weight` [I, H], `down.weight` [H, I] (float32) and
`draft_vocab` [V_d] (int64: target token ids); metadata (strings): `format` =
"tokenmill-draft-head", `version` = "1", `hidden_size`, `intermediate_size`, `vocab_size`
(the target's), `target` (the target model's name) and `target_fingerprint` (sha256 of the
target's embedding table and final norm, so a head never runs on a model it was not trained
for), plus training figures.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

FORMAT = "tokenmill-draft-head"
VERSION = "1"


def rms(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def target_fingerprint(embed_tokens: torch.Tensor, final_norm: torch.Tensor) -> str:
    """Identifies the target model: its embedding table and final norm weights."""
    h = hashlib.sha256()
    for t in (embed_tokens, final_norm):
        h.update(str(tuple(t.shape)).encode())
        h.update(t.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class TargetReadout:
    """What the head borrows from the target: embeddings, final norm, lm_head rows."""

    embed_tokens: torch.Tensor  # [vocab, H] float
    final_norm: torch.Tensor  # [H]
    lm_head_rows: torch.Tensor  # [V_d, H]: the target's lm_head rows of the draft vocab
    eps: float
    # inference: those rows in the target's own packed format and kernel (same logits as
    # the target's lm_head, a quarter of the fp32 bytes; padded, the first V_d outputs count);
    # None: the fp32 rows
    packed_rows: object | None = None


class DraftHead(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, draft_vocab: torch.Tensor):
        super().__init__()
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.fc = nn.Linear(2 * hidden_size, hidden_size)
        self.feature_norm = nn.Parameter(torch.ones(hidden_size))
        self.embed_norm = nn.Parameter(torch.ones(hidden_size))
        self.gate = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down = nn.Linear(intermediate_size, hidden_size, bias=False)
        nn.init.zeros_(self.down.weight)  # starts as fc alone
        self.register_buffer("draft_vocab", draft_vocab.long().clone())

    def step(self, feature: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """The predicted next feature ([..., H]) from a feature and the next token's embedding."""
        x = torch.cat([rms(feature) * self.feature_norm, rms(embedding) * self.embed_norm], -1)
        h = self.fc(x)
        return h + self.down(nn.functional.silu(self.gate(h)) * self.up(h))

    def draft_logits(self, feature: torch.Tensor, readout: TargetReadout) -> torch.Tensor:
        """Logits over the draft vocabulary, through the target's final norm and lm_head."""
        x = rms(feature, readout.eps) * readout.final_norm
        if readout.packed_rows is not None and not torch.is_grad_enabled() and x.dim() == 1:
            return readout.packed_rows(x.unsqueeze(0))[0, : readout.lm_head_rows.shape[0]]
        return x @ readout.lm_head_rows.t()

    # ------------------------------------------------------------------ file format

    def save(self, path: str | Path, target: str, fingerprint: str, vocab_size: int,
             extra: dict[str, str] | None = None) -> None:  # fmt: skip
        from safetensors.torch import save_file

        tensors = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "hidden_size": str(self.hidden_size),
            "intermediate_size": str(self.intermediate_size),
            "vocab_size": str(vocab_size),
            "target": target,
            "target_fingerprint": fingerprint,
            **(extra or {}),
        }
        save_file(tensors, str(path), metadata=meta)


def load_draft_head(
    path: str | Path, fingerprint: str, hidden_size: int, vocab_size: int
) -> tuple[DraftHead, dict[str, str]]:
    """The head in `path`, checked against the target it is about to run on."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"speculator file not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    except Exception as e:  # not a safetensors file at all
        raise ValueError(f"{path}: not a tokenmill draft head ({type(e).__name__}: {e})") from e
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}: not a tokenmill draft head (format {meta.get('format')!r})")
    if meta.get("version") != VERSION:
        raise ValueError(f"{path}: draft head format version {meta.get('version')}, need {VERSION}")
    if (
        meta.get("target_fingerprint") != fingerprint
        or int(meta.get("hidden_size", -1)) != hidden_size
        or int(meta.get("vocab_size", -1)) != vocab_size
    ):
        raise ValueError(
            f"{path}: this draft head was trained for another model ({meta.get('target')}, "
            f"hidden size {meta.get('hidden_size')}, vocabulary {meta.get('vocab_size')}); "
            f"the served model has hidden size {hidden_size}, vocabulary {vocab_size} and a "
            "different embedding table: train one for it with `tokenmill speculator train`"
        )
    vocab = tensors.get("draft_vocab")
    if vocab is None or vocab.dim() != 1 or not 0 < vocab.numel() <= vocab_size:
        raise ValueError(f"{path}: bad draft_vocab")
    if int(vocab.min()) < 0 or int(vocab.max()) >= vocab_size:
        raise ValueError(f"{path}: draft_vocab holds ids outside the vocabulary")
    gate = tensors.get("gate.weight")
    if gate is None or gate.dim() != 2 or gate.shape[1] != hidden_size:
        raise ValueError(f"{path}: tensors do not match the draft head (gate.weight)")
    # the width comes from the tensor itself: nothing is allocated from metadata alone
    head = DraftHead(hidden_size, gate.shape[0], vocab)
    try:
        head.load_state_dict(tensors)
    except RuntimeError as e:
        raise ValueError(f"{path}: tensors do not match the draft head ({e})") from e
    return head.eval(), meta
