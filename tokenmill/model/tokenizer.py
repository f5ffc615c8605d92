"""Tokenizers built with the `tokenizers` library, from a tokenizer.json or from GGUF metadata."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: the engine core starts without it (~50 ms)
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import pre_tokenizers

# Pre-tokenizer split patterns by GGUF `tokenizer.ggml.pre` (as llama.cpp names them).
_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# GGUF token types
_CONTROL, _USER_DEFINED = 3, 4
# Longer texts are encoded through encode_batch, which releases the GIL (encode holds it:
# a multi-MB prompt would stall every other thread of the process).
_GIL_FREE_CHARS = 4096


@dataclass
class Tokenizer:
    """A `tokenizers.Tokenizer` plus the special-token facts the engine needs."""

    source: HFTokenizer | Callable[[], HFTokenizer]  # the tokenizer, or how to build it
    bos_token_id: int | None
    eos_token_ids: list[int]
    add_bos_token: (
        bool  # prepend BOS ourselves (GGUF files); tokenizer.json post-processors do it themselves
    )
    bos_token: str | None = None
    eos_token: str | None = None
    special_token_ids: set[int] = field(default_factory=set)

    @cached_property
    def hf(self) -> HFTokenizer:
        return self.source() if callable(self.source) else self.source

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = _encode(self.hf, text, add_special_tokens)
        if (
            add_special_tokens
            and self.add_bos_token
            and self.bos_token_id is not None
            and (not ids or ids[0] != self.bos_token_id)
        ):
            ids = [self.bos_token_id, *ids]
        return ids

    def encode_as_text(self, text: str) -> list[int]:
        """Encodes text in which special-token strings are plain text (no control tokens)."""
        return _encode(self._plain_hf, text, False)

    @cached_property
    def _plain_hf(self) -> HFTokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        plain = HFTokenizer.from_str(self.hf.to_str())
        plain.encode_special_tokens = True
        return plain

    @cached_property
    def special_tokens(self) -> dict[str, int]:
        """Control-token strings (the ones a chat template uses) -> ids."""
        return {t.content: i for i, t in self.hf.get_added_tokens_decoder().items() if t.special}

    @cached_property
    def special_token_pattern(self) -> re.Pattern[str] | None:
        """Matches any control-token string (longest first); None if there are none."""
        names = sorted(self.special_tokens, key=len, reverse=True)
        return re.compile("|".join(map(re.escape, names))) if names else None

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self.hf.id_to_token(token_id)


def _encode(hf: HFTokenizer, text: str, add_special_tokens: bool) -> list[int]:
    if len(text) > _GIL_FREE_CHARS:
        return hf.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
    return hf.encode(text, add_special_tokens=add_special_tokens).ids


def _gpt2_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    from tokenizers import Regex, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("llama-bpe", "llama3", "smaug-bpe"):
        pattern = _LLAMA3_PATTERN
    elif pre in ("qwen2", "deepseek-r1-qwen"):
        pattern = _QWEN2_PATTERN
    elif pre in ("smollm", "starcoder", "refact"):
        # Digits one by one, then GPT-2's own split.
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:  # "gpt2", "default" and unknown: GPT-2's split
        return byte_level
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _spm_merges(vocab: dict[str, int], scores: Sequence[float]) -> list[tuple[str, str]]:
    """Merges for a SentencePiece BPE vocab, ranked by the merged piece's score."""
    merges: list[tuple[float, int, int, str, str]] = []
    for piece, piece_id in vocab.items():
        for i in range(1, len(piece)):
            left, right = piece[:i], piece[i:]
            if left in vocab and right in vocab:
                merges.append((-scores[piece_id], vocab[left], vocab[right], left, right))
    merges.sort()
    return [(left, right) for _, _, _, left, right in merges]


def tokenizer_from_gguf(meta: dict) -> Tokenizer:
    """The tokenizer a GGUF file describes. The `tokenizers` object is built on first use
    (~0.05 s for a 49k vocabulary): the engine core needs only the special-token facts to
    start, and builds it when a grammar or a recorder first needs it."""
    kind = meta["tokenizer.ggml.model"]
    if kind not in ("gpt2", "llama"):
        raise ValueError(f"unsupported GGUF tokenizer model {kind!r} (supported: gpt2, llama)")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    special_ids = {i for i, t in enumerate(types) if t == _CONTROL}
    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    eos_id = meta.get("tokenizer.ggml.eos_token_id")
    eos_ids = [eos_id] if eos_id is not None else []
    eot_id = meta.get("tokenizer.ggml.eot_token_id")
    if eot_id is not None and eot_id not in eos_ids:
        eos_ids.append(eot_id)
    return Tokenizer(
        source=lambda: _gguf_hf_tokenizer(meta, tokens, types),
        bos_token_id=bos_id,
        eos_token_ids=eos_ids,
        add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", kind == "llama")),
        bos_token=tokens[bos_id] if bos_id is not None else None,
        eos_token=tokens[eos_id] if eos_id is not None else None,
        special_token_ids=special_ids,
    )


def _gguf_hf_tokenizer(meta: dict, tokens: list[str], types: list[int]) -> HFTokenizer:
    from tokenizers import AddedToken, decoders, models, normalizers
    from tokenizers import Tokenizer as HFTokenizer

    vocab = {tok: i for i, tok in enumerate(tokens)}
    if meta["tokenizer.ggml.model"] == "gpt2":
        merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
        hf = HFTokenizer(models.BPE(vocab, merges, fuse_unk=False, ignore_merges=False))
        hf.pre_tokenizer = _gpt2_pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"))
        hf.decoder = decoders.ByteLevel()
    else:  # "llama": SentencePiece BPE
        scores = list(meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens))
        unk_id = meta.get("tokenizer.ggml.unknown_token_id", 0)
        hf = HFTokenizer(
            models.BPE(
                vocab,
                _spm_merges(vocab, scores),
                unk_token=tokens[unk_id],
                fuse_unk=True,
                byte_fallback=True,
            )
        )
        prefix = "▁" if meta.get("tokenizer.ggml.add_space_prefix", True) else ""
        hf.normalizer = normalizers.Sequence(
            [normalizers.Prepend(prefix), normalizers.Replace(" ", "▁")]
            if prefix
            else [normalizers.Replace(" ", "▁")]
        )
        hf.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
            + ([decoders.Strip(" ", 1, 0)] if prefix else [])
        )
    special = [
        AddedToken(tok, special=types[i] == _CONTROL, normalized=False)
        for i, tok in enumerate(tokens)
        if types[i] in (_CONTROL, _USER_DEFINED)
    ]
    hf.add_tokens(special)
    return hf


def tokenizer_from_files(
    tokenizer_json: str,
    tokenizer_config: dict,
    eos_token_ids: Sequence[int] = (),
) -> Tokenizer:
    from tokenizers import Tokenizer as HFTokenizer

    hf = HFTokenizer.from_file(tokenizer_json)

    def token_text(value: object) -> str | None:
        if isinstance(value, dict):
            return value.get("content")
        return value if isinstance(value, str) else None

    bos = token_text(tokenizer_config.get("bos_token"))
    eos = token_text(tokenizer_config.get("eos_token"))
    bos_id = hf.token_to_id(bos) if bos else None
    eos_ids = list(eos_token_ids)
    eos_from_config = hf.token_to_id(eos) if eos else None
    if eos_from_config is not None and eos_from_config not in eos_ids:
        eos_ids.insert(0, eos_from_config)
    # A tokenizer.json post-processor adds BOS itself; only add it when the config asks
    # for it and the post-processor would not.
    probe = hf.encode("a", add_special_tokens=True).ids
    adds_bos_itself = bos_id is not None and bool(probe) and probe[0] == bos_id
    add_bos = bool(tokenizer_config.get("add_bos_token", False)) and not adds_bos_itself
    special_ids = {i for i, t in hf.get_added_tokens_decoder().items() if t.special}
    return Tokenizer(
        source=hf,
        bos_token_id=bos_id,
        eos_token_ids=eos_ids,
        add_bos_token=add_bos,
        bos_token=bos,
        eos_token=eos,
        special_token_ids=special_ids,
    )
