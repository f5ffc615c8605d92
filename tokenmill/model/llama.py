"""The Llama family in one implementation: SmolLM2, Llama 2/3, Mistral, Qwen2 (q/k/v bias).

Runs a flat batch of tokens (any mix of prefill chunks and decodes) against the paged KV
cache. Weights arrive as a name -> tensor dict in Hugging Face naming (loader.py maps GGUF
names onto it), float32 or, for the native method, packed GGUF blocks; projections sharing
an input are fused (qkv, gate_up).
"""

from __future__ import annotations

import torch

from tokenmill.kernels import ops
from tokenmill.model.arch_config import ArchConfig
from tokenmill.model.attention import AttentionBackend, AttentionMetadata
from tokenmill.model.fused_decode import FusedDecode, FusedLayer, OneCallDecoding
from tokenmill.model.linear import FloatMethod, dense_table  # noqa: F401 (re-exported)
from tokenmill.model.packed import PackedWeight, cat_rows
from tokenmill.model.rotary import RotaryEmbedding, rope_inv_freq


class LlamaLayer:
    def __init__(
        self, cfg: ArchConfig, weights: dict[str, torch.Tensor], prefix: str, method: FloatMethod
    ):
        def w(name: str) -> torch.Tensor | PackedWeight:
            return weights.pop(prefix + name)

        attn = "self_attn."
        qkv_w = cat_rows(
            [w(attn + "q_proj.weight"), w(attn + "k_proj.weight"), w(attn + "v_proj.weight")]
        )
        qkv_b = None
        if cfg.attention_bias:
            qkv_b = torch.cat(
                [w(attn + "q_proj.bias"), w(attn + "k_proj.bias"), w(attn + "v_proj.bias")]
            )
        self.method = method
        self.qkv_proj = method.linear(qkv_w, qkv_b)
        self.o_proj = method.linear(w(attn + "o_proj.weight"))
        self.gate_up_proj = method.linear(
            cat_rows([w("mlp.gate_proj.weight"), w("mlp.up_proj.weight")])
        )
        self.down_proj = method.linear(w("mlp.down_proj.weight"))
        self.input_norm = method.param(w("input_layernorm.weight"))
        self.post_attn_norm = method.param(w("post_attention_layernorm.weight"))
        self.eps = cfg.rms_norm_eps
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        rope: RotaryEmbedding,
        attn: AttentionBackend,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        m = self.method
        t = hidden.shape[0]
        qkv = self.qkv_proj(m.norm(hidden, self.input_norm, self.eps))
        qk_heads = self.num_heads + self.num_kv_heads
        if m.native:
            ops.rope_neox_(qkv, qk_heads, self.head_dim, positions, rope.cos, rope.sin)
            qk = qkv[:, : self.q_size + self.kv_size].view(t, qk_heads, self.head_dim)
        else:
            qk = rope.apply(
                positions, qkv[:, : self.q_size + self.kv_size].view(t, qk_heads, self.head_dim)
            )
        q = qk[:, : self.num_heads]
        k = qk[:, self.num_heads :]
        v = qkv[:, self.q_size + self.kv_size :].view(t, self.num_kv_heads, self.head_dim)
        hidden = self.o_proj(m.activation(attn.forward(q, k, v, kv_cache, meta)), residual=hidden)
        gate_up = self.gate_up_proj(m.norm(hidden, self.post_attn_norm, self.eps))
        return self.down_proj(m.silu_mul(gate_up), residual=hidden)


class LlamaForCausalLM(OneCallDecoding):
    cuda_graph_safe = True  # decode steps may replay CUDA graphs

    def __init__(
        self,
        cfg: ArchConfig,
        weights: dict[str, torch.Tensor],
        max_positions: int,
        method: FloatMethod | None = None,
        rope_freq_factors: torch.Tensor | None = None,
    ) -> None:
        self.config = cfg
        self.method = method = method or FloatMethod()
        weights = dict(weights)
        embed = weights.pop("model.embed_tokens.weight")
        self.embed_tokens = method.table(embed)  # lookups read a few rows
        self.layers = [
            LlamaLayer(cfg, weights, f"model.layers.{i}.", method)
            for i in range(cfg.num_hidden_layers)
        ]
        self.norm = method.param(weights.pop("model.norm.weight"))
        lm_head = weights.pop("lm_head.weight", None)
        if lm_head is None or cfg.tie_word_embeddings:
            # tied: the native method reads the packed table, the others the float one
            lm_head = embed if isinstance(embed, PackedWeight) else self.embed_tokens
        self.lm_head = method.lm_head(lm_head)
        leftover = [k for k in weights if not k.endswith("rotary_emb.inv_freq")]
        if leftover:
            raise ValueError(f"unused weights in checkpoint: {leftover[:5]}")
        inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, rope_freq_factors)
        self.rope = RotaryEmbedding(cfg.head_dim, max_positions, inv_freq, method.device)
        self._fused_decode = FusedDecode()  # built at the first step it can run

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn: AttentionBackend,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        hidden = self.embed_tokens[input_ids]
        fused = self.decode_in_one_call(hidden, positions, kv_caches, attn, meta)
        if fused is not None:
            return fused
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden = layer.forward(hidden, positions, self.rope, attn, kv_cache, meta)
        return hidden

    def fused_layers(self, attn) -> list[FusedLayer]:
        """The layers as the one-call decoder runs them."""
        return [
            FusedLayer(x.input_norm, x.post_attn_norm, x.qkv_proj, x.o_proj, x.gate_up_proj,
                       x.down_proj, self.rope, attn.scale, attn.sliding_window)  # fmt: skip
            for x in self.layers
        ]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + lm_head, only for the rows that get sampled."""
        return self.lm_head(self.method.norm(hidden, self.norm, self.config.rms_norm_eps))

    def greedy_tokens(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """compute_logits(hidden).max(dim=1).indices, bit for bit, where the lm_head can find
        the argmax without computing every logit in full (PackedLinear.greedy_argmax); None
        where it cannot (then compute the logits)."""
        argmax = getattr(self.lm_head, "greedy_argmax", None)
        if argmax is None or not self.method.kernels.greedy_argmax:
            return None
        x = self.method.norm(hidden, self.norm, self.config.rms_norm_eps)
        return argmax(x) if isinstance(x, torch.Tensor) else None
