"""Mixture-of-experts feed-forward: a router picks each token's top-k experts, the tokens are
grouped by expert (sorted once per step) and each expert runs one matmul over all of its
tokens, the outputs scattered back weighted by the routing weights. Routing as each family
defines it: softmax then top-k, renormalised or not (Mixtral, Qwen3-MoE, OLMoE), or top-k
then softmax over the chosen logits (GPT-OSS). Counts tokens per expert for /metrics.

On a device the experts' weights live there in the method's dtype (the router stays in the
dtype): bf16 / fp32 experts run as two grouped matmuls per layer with no host sync
(moe_grouped.py), so MoE decode steps replay CUDA graphs; FP8 experts (and the CPU's) run
one expert at a time, reading the experts' row counts on the host once per MoE layer."""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from tokenmill.model.arch_config import ArchConfig
from tokenmill.model.device_method import DeviceLinear, DeviceMethod
from tokenmill.model.linear import FloatMethod
from tokenmill.model.models.layers import GatedMLP
from tokenmill.model.models.moe_grouped import GroupedExperts
from tokenmill.model.packed import as_float, cat_rows

Routing = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]
# transformers 5's state dicts (--load-format dummy): a layer's experts as 3-D tensors
_FUSED = re.compile(r"(model\.layers\.\d+\.mlp\.experts\.)(gate_up_proj|down_proj)")


def split_fused_experts(weights: dict) -> dict:
    """`experts.gate_up_proj` [E, 2I, H] (gate rows first) and `experts.down_proj` [E, H, I]
    as one weight per expert, `experts.{e}.gate_up_proj.weight` / `.down_proj.weight`."""
    for name in [n for n in weights if _FUSED.fullmatch(n)]:
        prefix, kind = _FUSED.fullmatch(name).groups()
        for e, w in enumerate(weights.pop(name)):
            weights[f"{prefix}{e}.{kind}.weight"] = w
    return weights


def softmax_topk(renormalize: bool) -> Routing:
    """Probabilities over all experts, the k largest kept (renormalised to sum to 1)."""

    def route(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        probs = torch.softmax(logits.float(), dim=-1)
        weights, ids = torch.topk(probs, k, dim=-1)
        if renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids

    return route


def topk_softmax(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest logits, softmax over them (GPT-OSS)."""
    top, ids = torch.topk(logits.float(), k, dim=-1)
    return torch.softmax(top, dim=-1), ids


def router_linear(method: FloatMethod, weight, bias):
    """The router's layer: the method's own on the CPU; on a device in the method's dtype
    (FP8 checkpoints keep their routers unquantized, and few expert counts divide by 16)."""
    if isinstance(method, DeviceMethod):
        return DeviceLinear(weight, bias, method.device, method.dtype)
    return method.linear(weight, bias)


class ClampedSwiGLUExpert:
    """GPT-OSS's expert: gate clamped from above, up to [-limit, limit],
    (up + 1) * gate * sigmoid(alpha * gate); gate and up rows fused, biases on both."""

    def __init__(self, weights: dict, prefix: str, method: FloatMethod, cfg: ArchConfig):
        gate_up = cat_rows([weights.pop(prefix + "gate_proj.weight"),
                            weights.pop(prefix + "up_proj.weight")])  # fmt: skip
        bias = torch.cat([as_float(weights.pop(prefix + "gate_proj.bias")),
                          as_float(weights.pop(prefix + "up_proj.bias"))])  # fmt: skip
        self.method = method
        self.gate_up_proj = method.linear(gate_up, bias)
        self.down_proj = method.linear(
            weights.pop(prefix + "down_proj.weight"), weights.pop(prefix + "down_proj.bias")
        )
        self.limit, self.alpha = cfg.swiglu_limit, cfg.swiglu_alpha

    def activate(self, gate_up: torch.Tensor) -> torch.Tensor:
        half = gate_up.shape[1] // 2
        gate = gate_up[:, :half].clamp(max=self.limit)
        up = gate_up[:, half:].clamp(-self.limit, self.limit)
        return self.method.activation((up + 1) * (gate * torch.sigmoid(gate * self.alpha)))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(self.method.activation(x))
        return self.down_proj(self.activate(gate_up))


class SparseMoE:
    """Router + experts of one layer. Weights (HF naming, the family module's job to
    normalise): `{prefix}gate.weight` (+ `.bias`), `{prefix}experts.{e}.{gate,up,down}_proj`."""

    def __init__(
        self,
        cfg: ArchConfig,
        weights: dict,
        prefix: str,
        method: FloatMethod,
        routing: Routing,
        expert: Callable[[dict, str], Callable[[torch.Tensor], torch.Tensor]] | None = None,
    ) -> None:
        self.method = method
        self.gate = router_linear(
            method, weights.pop(prefix + "gate.weight"), weights.pop(prefix + "gate.bias", None)
        )
        make = expert or (lambda w, p: GatedMLP(w, p, method, cfg.hidden_act))
        self.experts = [make(weights, f"{prefix}experts.{e}.") for e in range(cfg.num_experts)]
        self.top_k, self.routing = cfg.num_experts_per_tok, routing
        self.tokens_per_expert = torch.zeros(
            cfg.num_experts, dtype=torch.int64, device=method.device
        )
        # on a device: every expert in two grouped matmuls, no host sync (moe_grouped.py)
        self.grouped = GroupedExperts.build(self.experts, method)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] float32, expert ids [T, k])."""
        return self.routing(self.gate(self.method.activation(x)), self.top_k)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        t, k = ids.shape
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)  # (token, slot) pairs grouped by expert
        counts = torch.zeros_like(self.tokens_per_expert).scatter_add_(
            0, flat, torch.ones_like(flat)
        )  # no host sync (bincount reads its largest value on the host)
        self.tokens_per_expert += counts
        grouped = x[order // k]  # each expert's rows, contiguous
        if self.grouped is not None:
            ys = self.grouped(grouped, flat[order], counts)
        else:
            outs, start = [], 0
            for e, n in enumerate(counts.tolist()):  # the step's one host sync in this layer
                if n:
                    outs.append(self.experts[e](grouped[start : start + n]))
                    start += n
            ys = torch.cat(outs) if len(outs) > 1 else outs[0]
        unsorted = torch.empty_like(ys)
        unsorted[order] = ys  # back to (token, slot) order: one scatter, not one per expert
        slot_weights = weights.to(x.dtype).unsqueeze(-1)
        return (unsorted.view(t, k, -1) * slot_weights).sum(dim=1)

    def per_token(self, x: torch.Tensor) -> torch.Tensor:
        """The same result one token and one expert at a time (the benchmark's baseline)."""
        weights, ids = self.route(x)
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(self.top_k):
                y = self.experts[int(ids[t, j])](x[t : t + 1])
                out[t] += y[0] * weights[t, j]
        return out


def dense_or_sparse(cfg: ArchConfig, weights: dict, prefix: str, method: FloatMethod,
                    layer: int, routing: Routing, expert=None):  # fmt: skip
    """The layer's feed-forward: a SparseMoE where the config has experts, else GatedMLP."""
    if cfg.is_moe_layer(layer):
        return SparseMoE(cfg, weights, prefix, method, routing, expert)
    return GatedMLP(weights, prefix, method, cfg.hidden_act)
