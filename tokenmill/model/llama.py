"""The Llama family in one implementation: SmolLM2, Llama 2/3, Mistral, Qwen2 (q/k/v bias).

Runs a flat batch of tokens (any mix of prefill chunks and decodes) against the paged KV
cache. Weights arrive as a name -> tensor dict in Hugging Face naming (loader.py maps GGUF
names onto it); projections sharing an input are fused (qkv, gate_up).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tokenmill.model.arch_config import ArchConfig
from tokenmill.model.linear import make_linear
from tokenmill.model.rotary import RotaryEmbedding, rope_inv_freq
from tokenmill.worker.attention import AttentionBackend, AttentionMetadata


class LlamaLayer:
    def __init__(
        self,
        cfg: ArchConfig,
        weights: dict[str, torch.Tensor],
        prefix: str,
        quantization: str | None,
    ):
        def w(name: str) -> torch.Tensor:
            return weights.pop(prefix + name)

        qkv_w = torch.cat(
            [
                w("self_attn.q_proj.weight"),
                w("self_attn.k_proj.weight"),
                w("self_attn.v_proj.weight"),
            ]
        )
        qkv_b = None
        if cfg.attention_bias:
            qkv_b = torch.cat(
                [w("self_attn.q_proj.bias"), w("self_attn.k_proj.bias"), w("self_attn.v_proj.bias")]
            )
        self.qkv_proj = make_linear(qkv_w, qkv_b, quantization)
        self.o_proj = make_linear(w("self_attn.o_proj.weight"), None, quantization)
        gate_up = torch.cat([w("mlp.gate_proj.weight"), w("mlp.up_proj.weight")])
        self.gate_up_proj = make_linear(gate_up, None, quantization)
        self.down_proj = make_linear(w("mlp.down_proj.weight"), None, quantization)
        self.input_norm = w("input_layernorm.weight").float()
        self.post_attn_norm = w("post_attention_layernorm.weight").float()
        self.eps = cfg.rms_norm_eps
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        self.intermediate_size = cfg.intermediate_size

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        rope: RotaryEmbedding,
        attn: AttentionBackend,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        t = hidden.shape[0]
        x = F.rms_norm(hidden, (hidden.shape[-1],), self.input_norm, self.eps)
        qkv = self.qkv_proj(x)
        qk = rope.apply(positions, qkv[:, : self.q_size + self.kv_size].view(t, -1, self.head_dim))
        q = qk[:, : self.num_heads]
        k = qk[:, self.num_heads :]
        v = qkv[:, self.q_size + self.kv_size :].view(t, self.num_kv_heads, self.head_dim)
        hidden = hidden + self.o_proj(attn.forward(q, k, v, kv_cache, meta))
        x = F.rms_norm(hidden, (hidden.shape[-1],), self.post_attn_norm, self.eps)
        gate_up = self.gate_up_proj(x)
        x = F.silu(gate_up[:, : self.intermediate_size]) * gate_up[:, self.intermediate_size :]
        return hidden + self.down_proj(x)


class LlamaForCausalLM:
    def __init__(
        self,
        cfg: ArchConfig,
        weights: dict[str, torch.Tensor],
        max_positions: int,
        quantization: str | None = None,
        rope_freq_factors: torch.Tensor | None = None,
    ) -> None:
        self.config = cfg
        weights = dict(weights)
        self.embed_tokens = weights.pop("model.embed_tokens.weight").float().contiguous()
        self.layers = [
            LlamaLayer(cfg, weights, f"model.layers.{i}.", quantization)
            for i in range(cfg.num_hidden_layers)
        ]
        self.norm = weights.pop("model.norm.weight").float()
        lm_head = weights.pop("lm_head.weight", None)
        if lm_head is None or cfg.tie_word_embeddings:
            lm_head = self.embed_tokens
        self.lm_head = make_linear(lm_head, None, quantization)
        leftover = [k for k in weights if not k.endswith("rotary_emb.inv_freq")]
        if leftover:
            raise ValueError(f"unused weights in checkpoint: {leftover[:5]}")
        inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, rope_freq_factors)
        self.rope = RotaryEmbedding(cfg.head_dim, max_positions, inv_freq)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn: AttentionBackend,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        hidden = self.embed_tokens[input_ids]
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden = layer.forward(hidden, positions, self.rope, attn, kv_cache, meta)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + lm_head, only for the rows that get sampled."""
        x = F.rms_norm(hidden, (hidden.shape[-1],), self.norm, self.config.rms_norm_eps)
        return self.lm_head(x)
