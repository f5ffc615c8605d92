"""Where a model's LoRA deltas go: per decoder layer, the fused linear layers (q/k/v,
o, gate/up, down) that adapters may target, the object holding each (the layer itself in
model/llama.py, its self_attn / mlp in the other families), and each module's shape.

Checkpoints that store q/k/v or gate/up fused (Phi-3 / Phi-4: `qkv_proj`, `gate_up_proj`)
get adapters on those fused names, as PEFT trains them there. A mixture-of-experts layer
has no dense MLP: adapters there target attention only."""

from __future__ import annotations

from collections.abc import Iterator

from tokenmill.model.lora import LoRAAdapter, check_lora

# fused layer attribute -> the modules (Hugging Face names) whose outputs it concatenates
GROUPS: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "o_proj": ("o_proj",),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "down_proj": ("down_proj",),
}
# the same layers where the checkpoint itself stores them fused (Phi-3 / Phi-4)
FUSED_GROUPS: dict[str, tuple[str, ...]] = {group: (group,) for group in GROUPS}
_FUSED_ARCHITECTURES = ("phi3",)
_HOLDERS = {"qkv_proj": "self_attn", "o_proj": "self_attn", "gate_up_proj": "mlp",
            "down_proj": "mlp"}  # fmt: skip


class LoRATargets:
    def __init__(self, model) -> None:
        cfg = model.config
        fused = cfg.architecture in _FUSED_ARCHITECTURES
        self.groups = FUSED_GROUPS if fused else GROUPS
        self.num_layers = cfg.num_hidden_layers
        h, q, kv, i = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
        self.shapes: dict[str, tuple[int, int]] = {
            "q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h),
            "qkv_proj": (h, q + 2 * kv), "gate_up_proj": (h, 2 * i),
        }  # fmt: skip
        # per layer: group -> the object whose attribute it is (absent: no such layer)
        self.holders: list[dict[str, object]] = []
        for layer in model.layers:
            found = {}
            for group in self.groups:
                for holder in (layer, getattr(layer, _HOLDERS[group], None)):
                    if holder is not None and hasattr(holder, group):
                        found[group] = holder
                        break
            self.holders.append(found)

    def linears(self) -> Iterator[tuple[int, str, object]]:
        """(layer, group, holder) of every linear layer adapters may target."""
        for layer, found in enumerate(self.holders):
            for group, holder in found.items():
                yield layer, group, holder

    def module_group(self, module: str) -> str | None:
        return next((g for g, modules in self.groups.items() if module in modules), None)

    def check(self, adapter: LoRAAdapter, max_rank: int) -> None:
        """ValueError naming what does not fit: a module this model's layers do not have
        (by name, or a mixture-of-experts layer's MLP), a shape or a rank."""
        for layer, module in adapter.deltas:
            group = self.module_group(module)
            if group is None:
                names = [m for modules in self.groups.values() for m in modules]
                raise ValueError(
                    f"target_modules: adapter {adapter.name!r} targets {module}; this model's "
                    f"layers take adapters on {', '.join(names)}"
                )
            if layer < self.num_layers and group not in self.holders[layer]:
                raise ValueError(
                    f"target_modules: adapter {adapter.name!r} targets layers.{layer}.{module}; "
                    f"that layer has no dense {group} (mixture of experts: attention only)"
                )
        check_lora(adapter, self.shapes, self.num_layers, max_rank)
