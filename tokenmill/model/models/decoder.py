"""The decoder shared by the families in models/: token embedding (optionally scaled),
pre-norm layers of self-attention and a feed-forward (gated MLP or mixture of experts; with
Gemma's extra norms around both), final norm, lm_head (optionally soft-capped). A family is a
subclass that sets a few class attributes and normalises its checkpoint's weight names."""

from __future__ import annotations

import torch

from tokenmill.model.arch_config import ArchConfig
from tokenmill.model.attention import AttentionBackend, AttentionMetadata
from tokenmill.model.fused_decode import FusedDecode, FusedLayer, OneCallDecoding
from tokenmill.model.linear import FloatMethod
from tokenmill.model.models.layers import GatedMLP, SelfAttention
from tokenmill.model.models.moe import (
    Routing,
    SparseMoE,
    dense_or_sparse,
    softmax_topk,
    split_fused_experts,
)
from tokenmill.model.models.norms import norm_weight, rms_norm
from tokenmill.model.models.rope import FamilyRotary, build_rotary
from tokenmill.model.packed import PackedWeight


class DecoderLayer:
    def __init__(self, model: DecoderModel, weights: dict, layer: int) -> None:
        cfg, method = model.config, model.method
        prefix = f"model.layers.{layer}."
        off, fp32 = model.norm_offset, model.fp32_norms

        def norm(name: str) -> torch.Tensor:
            return norm_weight(method, weights.pop(prefix + name), off, fp32)

        rope = model.local_rope if cfg.layer_window(layer) and model.local_rope else model.rope
        self.self_attn = SelfAttention(
            cfg, weights, prefix + "self_attn.", method, layer, rope, off, fp32
        )
        self.mlp = dense_or_sparse(
            cfg, weights, prefix + "mlp.", method, layer, model.routing, model.expert_factory()
        )
        self.input_norm = norm("input_layernorm.weight")
        self.post_attn_norm = norm("post_attention_layernorm.weight")
        self.sandwich = model.sandwich_norms
        if self.sandwich:
            self.pre_ff_norm = norm("pre_feedforward_layernorm.weight")
            self.post_ff_norm = norm("post_feedforward_layernorm.weight")
        self.method, self.eps = method, cfg.rms_norm_eps

    def fused_layer(self) -> FusedLayer | None:
        """The layer as the one-call decoder runs it: pre-norm attention (q/k norms per head
        or none, the native method's full or partial RoPE, no sinks or clipping; sandwich
        norms or not) and a SiLU- or GELU-gated MLP; else None."""
        a, mlp = self.self_attn, self.mlp
        if (
            not isinstance(mlp, GatedMLP) or a.qk_norm not in (None, "head")
            or a.sinks is not None or a.clip is not None or not self.method.native
        ):  # fmt: skip
            return None
        sandwich = (self.pre_ff_norm, self.post_ff_norm) if self.sandwich else (None, None)
        return FusedLayer(
            self.input_norm, self.post_attn_norm, a.qkv_proj, a.o_proj, mlp.gate_up_proj,
            mlp.down_proj, a.rope, a.scale, a.window, a.q_norm, a.k_norm, *sandwich,
            gelu=mlp.act != "silu",
        )  # fmt: skip

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionBackend,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        m, eps = self.method, self.eps
        x = rms_norm(m, hidden, self.input_norm, eps)
        if self.sandwich:  # Gemma: norms on each block's output, before the residual add
            a = self.self_attn.forward(x, positions, attn, kv_cache, meta)
            hidden = hidden + rms_norm(m, a, self.post_attn_norm, eps)
            x = rms_norm(m, hidden, self.pre_ff_norm, eps)
            return hidden + rms_norm(m, self.mlp(x), self.post_ff_norm, eps)
        hidden = self.self_attn.forward(x, positions, attn, kv_cache, meta, residual=hidden)
        x = rms_norm(m, hidden, self.post_attn_norm, eps)
        if isinstance(self.mlp, SparseMoE):
            return hidden.add_(self.mlp(x))
        return self.mlp(x, residual=hidden)


class DecoderModel(OneCallDecoding):
    """What the model runner drives: forward (hidden states of a flat batch),
    compute_logits, greedy_tokens; `config`, `method`, `embed_tokens`, `norm`, `lm_head`."""

    norm_offset = 0.0  # Gemma's norms scale by (1 + w)
    fp32_norms = False  # Gemma, GPT-OSS: norms scale in float32 and round once (norms.py)
    sandwich_norms = False  # Gemma's pre/post feed-forward norms and post-attention norm
    scale_embeddings = False  # Gemma: embeddings times sqrt(hidden_size)
    cuda_graph_safe = True  # decode steps may replay CUDA graphs (not with experts)

    def __init__(
        self,
        cfg: ArchConfig,
        weights: dict,
        max_positions: int,
        method: FloatMethod | None = None,
        rope_freq_factors: torch.Tensor | None = None,
    ) -> None:
        self.config = cfg
        self.method = method = method or FloatMethod()
        self.routing = self.routing_for(cfg)
        weights = split_fused_experts(self.normalize_weights(dict(weights)))
        embed = weights.pop("model.embed_tokens.weight")
        self.embed_tokens = method.table(embed)  # on the method's device, in its dtype
        self.embed_scale = None  # rounded to the dtype, as transformers does
        if self.scale_embeddings:
            self.embed_scale = torch.tensor(
                cfg.hidden_size**0.5, dtype=method.dtype, device=method.device
            )
        device = method.device
        self.rope = build_rotary(
            cfg, max_positions, None, cfg.rope_scaling, rope_freq_factors, device
        )
        self.local_rope: FamilyRotary | None = None
        if cfg.rope_local_theta is not None:
            self.local_rope = build_rotary(cfg, max_positions, cfg.rope_local_theta, device=device)
        self.layers = [DecoderLayer(self, weights, i) for i in range(cfg.num_hidden_layers)]
        self._fused_decode = FusedDecode()  # built at the first step it can run
        self.norm = norm_weight(
            method, weights.pop("model.norm.weight"), self.norm_offset, self.fp32_norms
        )
        lm_head = weights.pop("lm_head.weight", None)
        if lm_head is None or cfg.tie_word_embeddings:
            lm_head = embed if isinstance(embed, PackedWeight) else self.embed_tokens
        self.lm_head = method.lm_head(lm_head)
        # CUDA graphs replay fixed shapes: experts run one at a time read their row counts
        # on the host (grouped experts do not)
        self.cuda_graph_safe = not any(
            isinstance(x.mlp, SparseMoE) and x.mlp.grouped is None for x in self.layers
        )
        leftover = [k for k in weights if not k.endswith("rotary_emb.inv_freq")]
        if leftover:
            raise ValueError(f"unused weights in checkpoint: {leftover[:5]}")

    def normalize_weights(self, weights: dict) -> dict:
        """The checkpoint's names and layouts in the shared naming (families override)."""
        return weights

    def routing_for(self, cfg: ArchConfig) -> Routing:
        """Softmax over the experts, top-k, renormalised where the config says so."""
        return softmax_topk(cfg.norm_topk_prob)

    def expert_factory(self):
        """How one expert is built (None: a gated MLP with the config's activation)."""
        return None

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn: AttentionBackend,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        hidden = self.embed_tokens[input_ids]
        if self.embed_scale is not None:
            hidden = hidden * self.embed_scale
        fused = self.decode_in_one_call(hidden, positions, kv_caches, attn, meta)
        if fused is not None:
            return fused
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden = layer.forward(hidden, positions, attn, kv_cache, meta)
        return hidden

    def fused_layers(self, attn) -> list[FusedLayer] | None:
        """The layers as the one-call decoder runs them; None where one cannot."""
        layers = [layer.fused_layer() for layer in self.layers]
        return None if any(x is None for x in layers) else layers

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        x = rms_norm(self.method, hidden, self.norm, self.config.rms_norm_eps)
        logits = self.lm_head(self.method.activation(x))
        cap = self.config.final_logit_softcapping
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def greedy_tokens(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """The lm_head's argmax without every logit where it can (soft-capping keeps the
        order); None otherwise."""
        argmax = getattr(self.lm_head, "greedy_argmax", None)
        if argmax is None or not self.method.kernels.greedy_argmax:
            return None
        return argmax(rms_norm(self.method, hidden, self.norm, self.config.rms_norm_eps))

    def expert_load(self) -> torch.Tensor | None:
        """Tokens routed to each expert so far, [num_moe_layers, num_experts]; None when dense."""
        counts = [layer.mlp.tokens_per_expert for layer in self.layers
                  if isinstance(layer.mlp, SparseMoE)]  # fmt: skip
        return torch.stack(counts) if counts else None
