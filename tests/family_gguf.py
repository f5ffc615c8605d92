"""GGUF files written from a transformers model of the families in model/ (Llama included), in
llama.cpp's architecture names, tensor names and layouts (gguf package), for parity tests."""

from __future__ import annotations

import numpy as np
import torch

from tests.tiny_models import embedded_metadata

GGUF_ARCH = {
    "llama": "llama",
    "qwen3": "qwen3",
    "gemma3": "gemma3",
    "phi3": "phi3",
    "mixtral": "llama",
    "qwen3_moe": "qwen3moe",
    "olmoe": "olmoe",
    "gpt_oss": "gpt-oss",
}
_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "self_attn.sinks": "attn_sinks.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
    "mlp.router.weight": "ffn_gate_inp.weight",
    "mlp.router.bias": "ffn_gate_inp.bias",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}
_POST_ATTENTION_NORM = {"gemma3", "gpt_oss"}  # post_attention_layernorm -> post_attention_norm


def _permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's q/k row permutation for the llama architecture."""
    return (
        w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _experts(family: str, layer_sd: dict) -> dict[str, np.ndarray]:
    """3-D expert tensors [E, rows, cols] (and [E, rows] biases) in llama.cpp's names."""
    if family == "gpt_oss":
        gate_up, down = layer_sd["mlp.experts.gate_up_proj"], layer_sd["mlp.experts.down_proj"]
        bias = layer_sd["mlp.experts.gate_up_proj_bias"]
        return {
            "ffn_gate_exps.weight": gate_up[..., ::2].transpose(0, 2, 1),
            "ffn_up_exps.weight": gate_up[..., 1::2].transpose(0, 2, 1),
            "ffn_down_exps.weight": down.transpose(0, 2, 1),
            "ffn_gate_exps.bias": bias[:, ::2],
            "ffn_up_exps.bias": bias[:, 1::2],
            "ffn_down_exps.bias": layer_sd["mlp.experts.down_proj_bias"],
        }
    names = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}
    if family == "mixtral":
        names = {"w1": "gate", "w3": "up", "w2": "down"}
    prefix = "block_sparse_moe.experts." if family == "mixtral" else "mlp.experts."
    count = len({k.split(".")[2] for k in layer_sd if k.startswith(prefix)})
    out = {}
    for hf, gg in names.items():
        if count:
            out[f"ffn_{gg}_exps.weight"] = np.stack(
                [layer_sd[f"{prefix}{e}.{hf}.weight"] for e in range(count)]
            )
    return out


def _metadata(writer, family: str, cfg) -> None:
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    params = cfg.rope_parameters
    params = params.get("full_attention", params)
    writer.add_rope_freq_base(params["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    experts = getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None)
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(cfg.num_experts_per_tok)
        width = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
        writer.add_expert_feed_forward_length(width)
    if family == "gemma3":
        writer.add_sliding_window(cfg.sliding_window)
        writer.add_sliding_window_pattern([t == "sliding_attention" for t in cfg.layer_types])
        writer.add_rope_freq_base_swa(cfg.rope_parameters["sliding_attention"]["rope_theta"])
        if cfg.final_logit_softcapping:
            writer.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if family == "phi3":
        writer.add_rope_dimension_count(int(head_dim * params.get("partial_rotary_factor", 1.0)))
        writer.add_rope_scaling_orig_ctx_len(params["original_max_position_embeddings"])
    if family == "gpt_oss":
        writer.add_sliding_window(cfg.sliding_window)
        writer.add_rope_scaling_type(gguf_rope_yarn())
        writer.add_rope_scaling_factor(params["factor"])
        writer.add_rope_scaling_orig_ctx_len(params["original_max_position_embeddings"])


def gguf_rope_yarn():
    import gguf

    return gguf.RopeScalingType.YARN


def _tokenizer(writer) -> None:
    meta = embedded_metadata()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    writer.add_token_list(meta["tokenizer.ggml.tokens"])
    writer.add_token_types(meta["tokenizer.ggml.token_type"])
    writer.add_token_merges(meta["tokenizer.ggml.merges"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(meta["tokenizer.chat_template"])


def _saved_state(model) -> dict[str, torch.Tensor]:
    """The weights as a checkpoint stores them (transformers fuses experts in memory)."""
    import tempfile

    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        return load_file(f"{tmp}/model.safetensors")


def write_family_gguf(model, family: str, path, qtype_name: str = "F32") -> None:
    """`qtype_name`: the format of 2-D and 3-D weights (norms, biases, routers stay F32)."""
    import gguf
    from gguf.quants import quantize

    cfg = model.config
    qtype = gguf.GGMLQuantizationType[qtype_name]
    writer = gguf.GGUFWriter(str(path), GGUF_ARCH[family])
    _metadata(writer, family, cfg)
    _tokenizer(writer)
    sd = {k: v.float().numpy() for k, v in _saved_state(model).items()}
    tensors: dict[str, np.ndarray] = {}
    if family == "phi3":
        params = cfg.rope_parameters
        tensors["rope_factors_long.weight"] = np.array(params["long_factor"], np.float32)
        tensors["rope_factors_short.weight"] = np.array(params["short_factor"], np.float32)
    tensors["token_embd.weight"] = sd.pop("model.embed_tokens.weight")
    tensors["output_norm.weight"] = sd.pop("model.norm.weight")
    if "lm_head.weight" in sd and not cfg.tie_word_embeddings:
        tensors["output.weight"] = sd.pop("lm_head.weight")
    for layer in range(cfg.num_hidden_layers):
        prefix = f"model.layers.{layer}."
        layer_sd = {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)}
        for name, gname in _experts(family, layer_sd).items():
            tensors[f"blk.{layer}.{name}"] = np.ascontiguousarray(gname)
        for name, data in layer_sd.items():
            if "experts" in name:
                continue
            gname = _LAYER[name]
            if name == "post_attention_layernorm.weight" and family in _POST_ATTENTION_NORM:
                gname = "post_attention_norm.weight"
            permuted = family in ("llama", "mixtral")  # llama.cpp's "llama" q/k row order
            if permuted and name == "self_attn.q_proj.weight":
                data = _permute(data, cfg.num_attention_heads)
            elif permuted and name == "self_attn.k_proj.weight":
                data = _permute(data, cfg.num_key_value_heads)
            tensors[f"blk.{layer}.{gname}"] = data
    for name, data in tensors.items():
        if family == "gemma3" and name.endswith("norm.weight"):
            data = data + 1.0  # llama.cpp's converter stores Gemma's (1 + w)
        data = np.ascontiguousarray(data, dtype=np.float32)
        small = data.ndim == 1 or "ffn_gate_inp" in name or name.endswith(".bias")
        if small or qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, data)
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, data.astype(np.float16))
        else:
            writer.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
