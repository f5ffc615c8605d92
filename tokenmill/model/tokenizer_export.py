"""A served model's tokenizer as a Hugging Face tokenizer folder (`tokenmill tokenizer export`).

Clients that count or synthesize tokens locally load a tokenizer with
`AutoTokenizer.from_pretrained(path)` (GuideLLM's synthetic prompts, lm-eval's local
tokenizer, token-budget checks in gateways). An embedded or GGUF model has no such folder and
the machines reach no model hub, so this writes one from the model file: `tokenizer.json` (the
same `tokenizers` pipeline the server encodes with, plus the BOS the engine prepends where the
model file asks for one), `tokenizer_config.json` (special tokens, chat template, context
length) and `special_tokens_map.json`. Encoding and chat rendering match the server's.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tokenmill.model.model_files import ModelFiles, read_model_info

FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def export_tokenizer(info: ModelFiles, directory: str | Path) -> list[Path]:
    """Writes the tokenizer folder (created if missing); returns the files written."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import processors

    tok = info.tokenizer
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    hf = HFTokenizer.from_str(tok.hf.to_str())  # a copy: the post-processor is the folder's
    if tok.add_bos_token and tok.bos_token is not None and tok.bos_token_id is not None:
        bos = tok.bos_token
        bos_first = processors.TemplateProcessing(
            single=f"{bos} $A",
            pair=f"{bos} $A {bos} $B:1",
            special_tokens=[(bos, tok.bos_token_id)],
        )
        kept = hf.post_processor  # e.g. byte-level offset trimming: kept, BOS added after it
        hf.post_processor = bos_first if kept is None else processors.Sequence([kept, bos_first])
    special = {
        key: value
        for key, value in (("bos_token", tok.bos_token), ("eos_token", tok.eos_token))
        if value is not None
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "chat_template": info.chat_template.source,
        "model_max_length": info.arch.max_position_embeddings,
        "clean_up_tokenization_spaces": False,
        "name_or_path": info.name,
    }
    written = []
    for name, write in (
        ("tokenizer.json", lambda p: hf.save(str(p))),
        ("tokenizer_config.json", lambda p: p.write_text(json.dumps(config, indent=2))),
        ("special_tokens_map.json", lambda p: p.write_text(json.dumps(special, indent=2))),
    ):
        path = out / name
        partial = path.with_name(f".{name}.partial")
        write(partial)
        os.replace(partial, path)  # a reader never sees half a file
        written.append(path)
    return written


def add_tokenizer_parser(sub) -> None:
    tokenizer = sub.add_parser("tokenizer", help="the model's tokenizer for other tools")
    tsub = tokenizer.add_subparsers(dest="tokenizer_command", required=True)
    export = tsub.add_parser(
        "export",
        help="write the model's tokenizer as a Hugging Face tokenizer folder",
        description="Writes tokenizer.json, tokenizer_config.json (chat template, special "
        "tokens) and special_tokens_map.json for --model to DIR, for clients that load a "
        "tokenizer with AutoTokenizer.from_pretrained(DIR), e.g. GuideLLM's --tokenizer "
        "kind=huggingface_auto,model=DIR (no model hub needed).",
    )
    export.add_argument("directory", metavar="DIR")
    export.add_argument("--model", default=None, help="model path (default: the embedded model)")
    export.set_defaults(func=cmd_export_tokenizer)


def cmd_export_tokenizer(args) -> int:
    if not args.directory.strip():  # "" would be the working directory, unasked
        print("error: DIR: give the folder to write the tokenizer to", file=sys.stderr)
        return 2
    info = read_model_info(args.model)
    try:
        written = export_tokenizer(info, args.directory)
    except OSError as e:  # not a folder, not writable, disk full
        print(f"error: cannot write the tokenizer to {args.directory}: {e}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0
