"""Logprobs in the two OpenAI shapes (chat `content` list, legacy completions arrays)."""

from __future__ import annotations

from typing import Any

from tokenmill.model.tokenizer import Tokenizer
from tokenmill.outputs import PositionLogprobDict


def _bytes_to_unicode() -> dict[str, int]:
    """GPT-2 byte-level alphabet: printable stand-in character -> byte."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


_BYTE_OF = _bytes_to_unicode()


def token_bytes(tokenizer: Tokenizer, token_id: int, text: str) -> list[int]:
    """The token's raw bytes: exact for byte-level BPE and SentencePiece byte tokens."""
    piece = tokenizer.id_to_token(token_id) or ""
    if piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:
        return [int(piece[3:5], 16)]
    if "\ufffd" in text and piece and all(ch in _BYTE_OF for ch in piece):
        return [_BYTE_OF[ch] for ch in piece]
    return list(text.encode("utf-8"))


def _entry(tokenizer: Tokenizer, token_id: int, logprob: float, text: str | None) -> dict[str, Any]:
    text = text if text is not None else tokenizer.decode([token_id], skip_special_tokens=False)
    return {
        "token": text,
        "logprob": max(logprob, -9999.0),
        "bytes": token_bytes(tokenizer, token_id, text),
    }


def chat_logprobs_content(
    tokenizer: Tokenizer, token_ids: list[int], logprobs: list[PositionLogprobDict], top: int
) -> list[dict[str, Any]]:
    content = []
    for token_id, position in zip(token_ids, logprobs, strict=False):
        chosen = position[token_id]
        entry = _entry(tokenizer, token_id, chosen.logprob, chosen.decoded_token)
        ranked = sorted(position.items(), key=lambda kv: -kv[1].logprob)[:top]
        entry["top_logprobs"] = [
            _entry(tokenizer, t, lp.logprob, lp.decoded_token) for t, lp in ranked
        ]
        content.append(entry)
    return content


def completion_logprobs(
    tokenizer: Tokenizer,
    token_ids: list[int],
    logprobs: list[PositionLogprobDict | None],
    top: int,
    text_offset_start: int = 0,
) -> dict[str, Any]:
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    offset = text_offset_start
    for token_id, position in zip(token_ids, logprobs, strict=False):
        text = tokenizer.decode([token_id], skip_special_tokens=False)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if position is None:  # the first prompt token has no logprob
            token_logprobs.append(None)
            top_logprobs.append(None)
            continue
        token_logprobs.append(max(position[token_id].logprob, -9999.0))
        ranked = sorted(position.items(), key=lambda kv: -kv[1].logprob)[:top]
        top_logprobs.append(
            {(lp.decoded_token or ""): max(lp.logprob, -9999.0) for _, lp in ranked}
            if top
            else None
        )
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": offsets,
    }
