"""GGUF tokenizers rebuilt with `tokenizers`, checked against reference implementations."""

from __future__ import annotations

import pytest

from tests.tiny_models import embedded_metadata, embedded_tokenizer
from tokenmill.model.chat_template import ChatTemplate, ChatTemplateError
from tokenmill.model.tokenizer import tokenizer_from_gguf

SAMPLES = [
    "Hello world",
    "  leading spaces and trailing  ",
    "numbers 1234567 and 3.14159",
    "naïve café — ünïcödé, 日本語テキスト, emoji 🎉🚀",
    "code:\n\tdef f(x):\n\t\treturn {'a': [1, 2]}\n",
    "MiXeD CaSe, punctuation!!! ??? ...",
]


def test_gpt2_style_matches_transformers_gguf_tokenizer():
    from transformers import AutoTokenizer

    from tokenmill.model.embedded import embedded_model_path

    path = embedded_model_path()
    ref = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ours = embedded_tokenizer()
    for text in [*SAMPLES, "<|im_start|>user\nhi<|im_end|>"]:
        assert ours.encode(text) == ref.encode(text), text
        assert ours.decode(ours.encode(text), skip_special_tokens=False) == text


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory):
    sentencepiece = pytest.importorskip("sentencepiece")
    d = tmp_path_factory.mktemp("spm")
    corpus = d / "corpus.txt"
    corpus.write_text(
        ("\n".join(SAMPLES[:3] + SAMPLES[4:]) + "\nthe quick brown fox jumps over the lazy dog\n")
        * 50
    )
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(d / "m"),
        vocab_size=420,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        normalization_rule_name="identity",  # as Llama's own SentencePiece model
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        minloglevel=2,
        bos_id=1,
        eos_id=2,
        unk_id=0,
    )
    return sentencepiece.SentencePieceProcessor(model_file=str(d / "m.model"))


def test_llama_spm_style_matches_sentencepiece(spm_model):
    sp = spm_model
    types = []
    for i in range(sp.get_piece_size()):
        if sp.is_unknown(i):
            types.append(2)
        elif sp.is_control(i):
            types.append(3)
        elif sp.is_byte(i):
            types.append(6)
        else:
            types.append(1)
    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [sp.id_to_piece(i) for i in range(sp.get_piece_size())],
        "tokenizer.ggml.scores": [sp.get_score(i) for i in range(sp.get_piece_size())],
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }
    tok = tokenizer_from_gguf(meta)
    for text in SAMPLES:
        expected = sp.encode(text)
        assert tok.encode(text) == [1, *expected], text
        assert tok.decode(expected) == sp.decode(expected)


def test_chat_template_renders_like_hf():
    from jinja2.sandbox import SecurityError  # noqa: F401  (the sandbox is the point)

    meta = embedded_metadata()
    template = ChatTemplate(meta["tokenizer.chat_template"])
    text = template.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_chat_template_is_sandboxed_and_errors_cleanly():
    evil = ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(Exception) as err:
        evil.render([{"role": "user", "content": "x"}])
    assert "unsafe" in str(err.value).lower() or "security" in type(err.value).__name__.lower()
    raising = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        raising.render([{"role": "user", "content": "x"}])


def test_embedded_tokenizer_special_tokens():
    tok = embedded_tokenizer()
    assert tok.eos_token_ids == [2] and tok.bos_token_id == 1
    assert tok.encode("<|im_end|>", add_special_tokens=False) == [2]
    assert tok.decode([2, 19556], skip_special_tokens=True) == "Hello"
