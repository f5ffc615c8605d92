"""Tiny random-weight BERT encoders saved as sentence-transformers folders (config.json,
model.safetensors, a WordPiece tokenizer.json, modules.json, 1_Pooling/config.json), for
embedding tests against transformers and sentence-transformers."""

from __future__ import annotations

import json
from pathlib import Path

import torch

_WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "embeddings",
    "map",
    "text",
    "to",
    "vectors",
    "a",
    "an",
    "of",
    "and",
    "in",
    "is",
    "are",
    "was",
    "were",
    "hello",
    "world",
    "search",
    "query",
    "document",
    "retrieval",
    "answer",
    "question",
    "model",
]


def _tokenizer():
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces = [f"##{c}" for c in letters] + list(".,!?:")
    tokens = list(dict.fromkeys(specials + letters + pieces + _WORDS))
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tok.decoder = decoders.WordPiece()
    return tok, len(vocab)


def make_bert_folder(path: Path, pooling: str = "mean", normalize: bool = True, **overrides):
    """A BertModel folder as sentence-transformers saves one; `pooling`: "mean" or "cls"."""
    import transformers

    tok, vocab = _tokenizer()
    cfg = dict(
        vocab_size=vocab, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=96, max_position_embeddings=128, type_vocab_size=2,
    )  # fmt: skip
    cfg.update(overrides)
    torch.manual_seed(7)
    model = transformers.BertModel(transformers.BertConfig(**cfg)).float().eval()
    with torch.no_grad():  # default init leaves LayerNorms at 1/0 and biases at 0
        for name, p in model.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.2)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({
            "tokenizer_class": "BertTokenizer", "cls_token": "[CLS]", "sep_token": "[SEP]",
            "pad_token": "[PAD]", "unk_token": "[UNK]", "mask_token": "[MASK]",
            "do_lower_case": True, "model_max_length": cfg["max_position_embeddings"],
        })
    )  # fmt: skip
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]  # fmt: skip
    if normalize:
        modules.append(
            {"idx": 2, "name": "2", "path": "2_Normalize",
             "type": "sentence_transformers.models.Normalize"}
        )  # fmt: skip
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(
        json.dumps({
            "word_embedding_dimension": cfg["hidden_size"],
            "pooling_mode_cls_token": pooling == "cls",
            "pooling_mode_mean_tokens": pooling == "mean",
        })
    )  # fmt: skip
    return model
