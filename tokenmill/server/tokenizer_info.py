"""GET /tokenizer_info in vLLM's shape: what a client needs to tokenize like the server
(lm-eval's remote tokenizer reads eos/bos/pad tokens and the chat template here)."""

from __future__ import annotations

from typing import Any


def tokenizer_info(engine: Any) -> dict[str, Any]:
    tok = engine.tokenizer
    added = tok.hf.get_added_tokens_decoder()
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "pad_token": None,
        "unk_token": None,
        "add_bos_token": tok.add_bos_token,
        "model_max_length": engine.max_model_len,
        "vocab_size": tok.vocab_size,
        "chat_template": engine.chat_template.source,
        "added_tokens_decoder": {
            str(i): {"content": t.content, "special": t.special} for i, t in added.items()
        },
    }
