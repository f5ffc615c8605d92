"""BERT-family encoders for embeddings (`BertModel`): bidirectional attention over each
prompt whole, in the engine's flat batch. The engine schedules every prompt in one step
(engine/pooling.py: encoder_engine_config), so no KV cache is read or written; pooling
(CLS or mean, as the folder's sentence-transformers config says) happens in the runner."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tokenmill.model.attention import AttentionBackend, AttentionMetadata
from tokenmill.model.bert_config import BertConfig
from tokenmill.model.linear import FloatMethod

_ACT = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


def _strip(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The encoder's weights: a `bert.` prefix (BertForMaskedLM) dropped; heads (`cls.`)
    and the pooler (sentence embeddings pool the token states) left out."""
    out = {}
    for name, w in weights.items():
        name = name.removeprefix("bert.")
        if name.startswith(("cls.", "pooler.")) or name.endswith("position_ids"):
            continue
        out[name] = w.float() if isinstance(w, torch.Tensor) else w
    return out


class _Layer:
    def __init__(self, cfg: BertConfig, w: dict[str, torch.Tensor], p: str) -> None:
        att = p + "attention."
        self.qkv_w = torch.cat([w.pop(att + f"self.{n}.weight") for n in ("query", "key", "value")])
        self.qkv_b = torch.cat([w.pop(att + f"self.{n}.bias") for n in ("query", "key", "value")])
        self.o = (w.pop(att + "output.dense.weight"), w.pop(att + "output.dense.bias"))
        self.ln1 = (w.pop(att + "output.LayerNorm.weight"), w.pop(att + "output.LayerNorm.bias"))
        self.up = (w.pop(p + "intermediate.dense.weight"), w.pop(p + "intermediate.dense.bias"))
        self.down = (w.pop(p + "output.dense.weight"), w.pop(p + "output.dense.bias"))
        self.ln2 = (w.pop(p + "output.LayerNorm.weight"), w.pop(p + "output.LayerNorm.bias"))
        self.heads = cfg.num_attention_heads
        self.eps = cfg.layer_norm_eps
        self.act = _ACT[cfg.hidden_act]

    def forward(self, x: torch.Tensor, segments: list[tuple[int, int]]) -> torch.Tensor:
        t, h = x.shape
        d = h // self.heads
        q, k, v = F.linear(x, self.qkv_w, self.qkv_b).view(t, 3, self.heads, d).unbind(1)
        attn = torch.empty_like(x)
        for start, n in segments:  # each prompt attends to itself only (no causal mask)
            s = slice(start, start + n)
            out = F.scaled_dot_product_attention(
                q[s].transpose(0, 1), k[s].transpose(0, 1), v[s].transpose(0, 1)
            )
            attn[s] = out.transpose(0, 1).reshape(n, h)
        x = F.layer_norm(F.linear(attn, *self.o) + x, (h,), *self.ln1, self.eps)
        mlp = F.linear(self.act(F.linear(x, *self.up)), *self.down)
        return F.layer_norm(mlp + x, (h,), *self.ln2, self.eps)


class BertModel:
    """The encoder behind the engine's model interface (forward over a flat batch)."""

    encoder_only = True

    def __init__(self, cfg: BertConfig, weights: dict[str, torch.Tensor]) -> None:
        self.method = FloatMethod()  # float32 torch ops: its dtype is the KV pool's
        self.bert_config = cfg
        self.config = cfg.arch()
        w = _strip(weights)
        e = "embeddings."
        self.word = w.pop(e + "word_embeddings.weight")
        self.position = w.pop(e + "position_embeddings.weight")
        self.token_type = w.pop(e + "token_type_embeddings.weight")[0]  # one segment
        self.ln = (w.pop(e + "LayerNorm.weight"), w.pop(e + "LayerNorm.bias"))
        self.layers = [_Layer(cfg, w, f"encoder.layer.{i}.") for i in range(cfg.num_hidden_layers)]
        if w:
            raise ValueError(f"unused weights in checkpoint: {sorted(w)[:5]}")

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn: AttentionBackend,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        segments = _segments(positions)
        x = self.word[input_ids] + self.position[positions] + self.token_type
        x = F.layer_norm(x, (x.shape[1],), *self.ln, self.bert_config.layer_norm_eps)
        for layer in self.layers:
            x = layer.forward(x, segments)
        return x

    def final_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden.float()  # an encoder's last layer output is its token states

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise ValueError("model: an encoder (embedding) model has no language-model head")


def _segments(positions: torch.Tensor) -> list[tuple[int, int]]:
    """(start row, length) of each prompt in the flat batch: every prompt runs whole, from
    position 0, so a new prompt starts where the position is 0."""
    starts = (positions == 0).nonzero().flatten().tolist()
    if not starts or starts[0] != 0:
        raise ValueError("an encoder runs each prompt whole, from its first token")
    ends = [*starts[1:], positions.shape[0]]
    return [(s, e - s) for s, e in zip(starts, ends, strict=True)]


def build_encoder(files) -> BertModel | None:
    """The encoder model of a BERT folder's ModelFiles (weights read); None for others."""
    if files.arch.architecture != "bert":
        return None
    import json

    cfg = BertConfig.from_hf_config(json.loads((files.path / "config.json").read_text()))
    return BertModel(cfg, files.weights)
