"""Layer groups: the unit a quantization plan assigns a format to. A group is a set of
weights that run as one linear layer (q/k/v and gate/up are fused), named
`layers.<i>.attn_qkv`, `layers.<i>.attn_o`, `layers.<i>.mlp_gate_up`, `layers.<i>.mlp_down`
and `lm_head`; plans and reports select groups with shell-style patterns
(`layers.*.mlp_down`, `layers.0.*`)."""

from __future__ import annotations

import re
from fnmatch import fnmatchcase

GROUP_KINDS = ("attn_qkv", "attn_o", "mlp_gate_up", "mlp_down")
_KIND_OF = {
    "self_attn.q_proj": "attn_qkv",
    "self_attn.k_proj": "attn_qkv",
    "self_attn.v_proj": "attn_qkv",
    "self_attn.o_proj": "attn_o",
    "mlp.gate_proj": "mlp_gate_up",
    "mlp.up_proj": "mlp_gate_up",
    "mlp.down_proj": "mlp_down",
}
_LAYER_WEIGHT = re.compile(r"model\.layers\.(\d+)\.(.+)\.weight")


def group_of(name: str, tied_embeddings: bool) -> str | None:
    """The group of a weight (Hugging Face name), or None for weights that are not the
    matrix of a linear layer (norms, biases, an untied embedding table)."""
    if name == "lm_head.weight" or (tied_embeddings and name == "model.embed_tokens.weight"):
        return "lm_head"
    match = _LAYER_WEIGHT.fullmatch(name)
    if match and match.group(2) in _KIND_OF:
        return f"layers.{match.group(1)}.{_KIND_OF[match.group(2)]}"
    return None


def layer_group_weights(layer: int) -> dict[str, list[str]]:
    """A decoder layer's groups by kind, each with its weights' names in fused order."""
    names: dict[str, list[str]] = {kind: [] for kind in GROUP_KINDS}
    for module, kind in _KIND_OF.items():
        names[kind].append(f"model.layers.{layer}.{module}.weight")
    return names


def linear_groups(names, tie_word_embeddings: bool) -> dict[str, str]:
    """weight name -> group, for the weights of `names` that are linear layers' matrices (the
    embedding table is the output layer when tied, or when there is no lm_head weight)."""
    names = list(names)
    tied = tie_word_embeddings or "lm_head.weight" not in names
    groups = {name: group_of(name, tied) for name in names}
    return {name: group for name, group in groups.items() if group is not None}


def all_groups(num_layers: int) -> list[str]:
    return [f"layers.{i}.{kind}" for i in range(num_layers) for kind in GROUP_KINDS] + ["lm_head"]


def matches(group: str, pattern: str) -> bool:
    return fnmatchcase(group, pattern)


def sensitivity_groups(num_layers: int) -> list[str]:
    """The patterns a sensitivity table measures one at a time: each kind across all
    layers, then each layer across all kinds, then the output layer."""
    return (
        [f"layers.*.{kind}" for kind in GROUP_KINDS]
        + [f"layers.{i}.*" for i in range(num_layers)]
        + ["lm_head"]
    )
