"""`tokenmill tokenizer export`: the folder loads with transformers' AutoTokenizer (offline) and
encodes, decodes and renders chats as the server does."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from tokenmill.cli import main
from tokenmill.model.model_files import read_model_info
from tokenmill.model.tokenizer_export import FILES, export_tokenizer

TEXTS = [
    "Hello world",
    "  leading spaces and\ttabs\nand new lines\n\n",
    "Ünïcödé — 東京 🚀 naïve café",
    'def f(x):\n    return {"a": [1, 2, 3]}  # code',
    "<|im_start|>user\nspecial tokens in text<|im_end|>",
    "1234567890 3.14159 -42",
    "",
]


def auto_tokenizer(path):
    os.environ["HF_HUB_OFFLINE"] = "1"  # a folder on disk: nothing may reach a hub
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="module")
def embedded():
    return read_model_info(None)


def test_the_exported_folder_encodes_decodes_and_renders_as_the_server(embedded, tmp_path):
    written = export_tokenizer(embedded, tmp_path / "tok")
    assert sorted(p.name for p in written) == sorted(FILES)
    assert not list((tmp_path / "tok").glob(".*partial"))
    hf = auto_tokenizer(tmp_path / "tok")
    ours = embedded.tokenizer
    for text in TEXTS:
        ids = hf(text).input_ids
        assert ids == ours.encode(text), text
        assert hf.decode(ids, skip_special_tokens=True) == ours.decode(ids), text
    assert hf.eos_token_id == ours.eos_token_id
    assert hf.model_max_length == embedded.arch.max_position_embeddings
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "And now?"},
    ]
    for generation_prompt in (True, False):
        rendered = hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )
        assert rendered == embedded.chat_template.render(messages, generation_prompt)


@pytest.mark.parametrize("post_processor", [None, "byte_level"])
def test_a_model_that_prepends_bos_gets_it_from_the_exported_folder(
    embedded, tmp_path, post_processor
):
    """GGUF files may ask for BOS (the engine prepends it): the folder's post-processor adds
    it (after the tokenizer's own one, if any), so a client counts the tokens the server does."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import processors

    tok = embedded.tokenizer
    hf = HFTokenizer.from_str(tok.hf.to_str())
    if post_processor == "byte_level":
        hf.post_processor = processors.ByteLevel(trim_offsets=False)
    bos = dataclasses.replace(tok, source=hf, add_bos_token=True)
    assert bos.bos_token_id is not None
    export_tokenizer(dataclasses.replace(embedded, tokenizer=bos), tmp_path / "tok")
    hf = auto_tokenizer(tmp_path / "tok")
    for text in TEXTS[:4]:
        ids = hf(text).input_ids
        assert ids[0] == bos.bos_token_id
        assert ids == bos.encode(text), text
    assert hf("x", add_special_tokens=False).input_ids == bos.encode("x", False)


def test_the_cli_writes_the_folder(tmp_path, capsys, monkeypatch):
    assert main(["tokenizer", "export", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out.split()
    assert sorted(os.path.basename(p) for p in printed) == sorted(FILES)
    config = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>" and "chat_template" in config
    assert main(["tokenizer", "export", str(tmp_path / "x"), "--model", str(tmp_path / "no")]) != 0
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    monkeypatch.chdir(tmp_path / "out")
    for blank in ("", "  "):  # not the working directory by accident
        assert main(["tokenizer", "export", blank]) == 2
        assert "give the folder" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(FILES)
    (tmp_path / "a-file").write_text("")
    assert main(["tokenizer", "export", str(tmp_path / "a-file")]) == 2
    assert "cannot write the tokenizer" in capsys.readouterr().err
