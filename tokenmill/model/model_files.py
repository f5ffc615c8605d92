"""What a front end reads from a model file — architecture, tokenizer, chat template — without
the weights and without torch (the API process, the router and the CLI use this; the engine's
weight loading is in model/loader.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tokenmill.model.arch_config import ArchConfig
from tokenmill.model.bert_config import encoder_arch
from tokenmill.model.chat_template import ChatTemplate
from tokenmill.model.embedded import EMBEDDED_MODEL_NAME, embedded_model_path
from tokenmill.model.gguf_layout import GGUF_CONFIG_TENSORS
from tokenmill.model.tokenizer import Tokenizer, tokenizer_from_files, tokenizer_from_gguf

if TYPE_CHECKING:
    import torch

    from tokenmill.model.gguf_file import GGUFFile
    from tokenmill.model.packed import PackedWeight


@dataclass
class ModelFiles:
    """Everything read from a model file, before the weights become a runnable model."""

    name: str
    path: Path
    arch: ArchConfig
    # Hugging Face names; float32, or packed GGUF blocks when loaded with packed=True; empty
    # when read without weights
    weights: dict[str, torch.Tensor | PackedWeight]
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    rope_freq_factors: torch.Tensor | None = None


def resolve_model_path(model: str | None) -> tuple[str, Path]:
    if model is None:
        return EMBEDDED_MODEL_NAME, embedded_model_path()
    path = Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"model path {model!r} does not exist (models load from a local GGUF file or HF folder)"
        )
    name = path.stem if path.is_file() else path.name
    return name, path


def model_source(model: str | None) -> tuple[str, Path, str]:
    """(name, path of the file or folder to read, "gguf" or "hf")."""
    name, path = resolve_model_path(model)
    if path.is_file() and path.suffix == ".gguf":
        return name, path, "gguf"
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if (path / "config.json").exists():
            return name, path, "hf"
        if len(ggufs) == 1:
            return name, ggufs[0], "gguf"
    raise ValueError(
        f"{path}: expected a .gguf file or a folder with config.json and *.safetensors"
    )


def read_model_info(model: str | None) -> ModelFiles:
    """The model's architecture, tokenizer and chat template (no weights): fast, torch-free."""
    name, path, kind = model_source(model)
    if kind == "hf":
        return hf_model_info(name, path)
    from tokenmill.model.gguf_file import GGUFFile

    return gguf_model_info(name, path, GGUFFile(path))


# ---------------------------------------------------------------- GGUF


def gguf_arch(gguf: GGUFFile) -> ArchConfig:
    names = {t.name for t in gguf.tensors}
    tensors = {
        t.name: (list(t.data) if t.name in GGUF_CONFIG_TENSORS else None) for t in gguf.tensors
    }
    return ArchConfig.from_gguf_metadata(
        gguf.metadata,
        has_output_tensor="output.weight" in names,
        has_qkv_bias=bool(names & {"blk.0.attn_q.bias", "blk.0.attn_qkv.bias"}),
        tensors=tensors,
    )


def gguf_model_info(name: str, path: Path, gguf: GGUFFile) -> ModelFiles:
    meta = gguf.metadata
    arch = gguf_arch(gguf)
    tokenizer = tokenizer_from_gguf(meta)
    template = ChatTemplate(
        meta.get("tokenizer.chat_template"), tokenizer.bos_token, tokenizer.eos_token
    )
    return ModelFiles(name, path, arch, {}, tokenizer, template)


# ---------------------------------------------------------------- HF folder


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def hf_model_info(name: str, path: Path) -> ModelFiles:
    config = _read_json(path / "config.json")
    arch = encoder_arch(config) or ArchConfig.from_hf_config(config)
    if not (path / "tokenizer.json").exists():
        if any(path.glob("*.safetensors")) or not config:
            raise ValueError(f"{path}: tokenizer.json is missing")
        return _with_embedded_tokenizer(name, path, arch)
    tok_config = _read_json(path / "tokenizer_config.json")
    gen_config = _read_json(path / "generation_config.json")
    eos = gen_config.get("eos_token_id", config.get("eos_token_id"))
    eos_ids = eos if isinstance(eos, list) else ([eos] if eos is not None else [])
    tokenizer = tokenizer_from_files(str(path / "tokenizer.json"), tok_config, eos_ids)
    template_source = tok_config.get("chat_template")
    if isinstance(template_source, list):  # named templates: take "default"
        template_source = next(
            (t["template"] for t in template_source if t.get("name") == "default"), None
        )
    jinja_file = path / "chat_template.jinja"
    if template_source is None and jinja_file.exists():
        template_source = jinja_file.read_text()
    template = ChatTemplate(template_source, tokenizer.bos_token, tokenizer.eos_token)
    return ModelFiles(name, path, arch, {}, tokenizer, template)


def _with_embedded_tokenizer(name: str, path: Path, arch: ArchConfig) -> ModelFiles:
    """A folder with only config.json (benchmarks of real shapes, --load-format dummy): the
    embedded model's tokenizer and chat template, whose ids all fit a larger vocabulary."""
    embedded = read_model_info(None)
    if embedded.tokenizer.vocab_size > arch.vocab_size:
        raise ValueError(
            f"{path}: no tokenizer.json, and the embedded tokenizer's "
            f"{embedded.tokenizer.vocab_size} ids do not fit vocab_size {arch.vocab_size}"
        )
    return ModelFiles(name, path, arch, {}, embedded.tokenizer, embedded.chat_template)
