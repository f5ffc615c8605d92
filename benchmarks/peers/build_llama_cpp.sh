#!/usr/bin/env bash
# Build the llama.cpp peer used by tokenmill's benchmarks.
#
# The sources come from the llama-cpp-python sdist on PyPI (its vendor/llama.cpp
# tree), pinned below, so the build needs nothing but PyPI, cmake and a C++
# compiler. Binaries land outside the repo, in
#   ${TOKENMILL_CACHE:-$HOME/.cache/tokenmill}/llama.cpp-<version>/bin/
#
# Usage:
#   benchmarks/peers/build_llama_cpp.sh                 # build (no-op if already built)
#   benchmarks/peers/build_llama_cpp.sh --print-bin-dir # print the bin dir and exit
#   benchmarks/peers/build_llama_cpp.sh --force         # rebuild even if binaries exist
#
# Environment:
#   TOKENMILL_CACHE   cache root (default: $HOME/.cache/tokenmill)
#   PYTHON            python whose pip downloads the sdist
#                     (default: the repo's .venv/bin/python if present, else python3)
#   JOBS              parallel build jobs (default: 2)
#   KEEP_BUILD=1      keep the unpacked sources and build tree under the cache dir
#   LLAMA_CPP_AMX     auto (default) | on | off. GGML_NATIVE=ON compiles Intel AMX
#                     kernels when the CPU advertises AMX, but some VMs (e.g. this
#                     project's Firecracker machines) advertise AMX yet fault with
#                     SIGILL on tile instructions (llama-bench dies on Q4_0/Q4_1/Q8_0
#                     models). auto runs a tiny probe and builds with -mno-amx-* if
#                     AMX does not actually work.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="0.3.36"
TARGETS=(llama-bench llama-batched-bench llama-server llama-perplexity llama-quantize)

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/../.." && pwd)"

CACHE_ROOT="${TOKENMILL_CACHE:-${HOME}/.cache/tokenmill}"
CACHE_DIR="${CACHE_ROOT}/llama.cpp-${LLAMA_CPP_PYTHON_VERSION}"
BIN_DIR="${CACHE_DIR}/bin"

if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "${REPO_ROOT}/.venv/bin/python" ]]; then
        PYTHON="${REPO_ROOT}/.venv/bin/python"
    else
        PYTHON=python3
    fi
fi
JOBS="${JOBS:-2}"

force=0
for arg in "$@"; do
    case "${arg}" in
        --print-bin-dir) echo "${BIN_DIR}"; exit 0 ;;
        --force) force=1 ;;
        -h|--help) sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: ${arg}" >&2; exit 2 ;;
    esac
done

all_built() {
    local t
    [[ -f "${CACHE_DIR}/BUILD_INFO" ]] || return 1
    for t in "${TARGETS[@]}"; do
        [[ -x "${BIN_DIR}/${t}" ]] || return 1
    done
}

if [[ ${force} -eq 0 ]] && all_built; then
    echo "${BIN_DIR}"
    exit 0
fi

for tool in cmake c++; do
    command -v "${tool}" >/dev/null 2>&1 || { echo "error: ${tool} not found" >&2; exit 1; }
done

mkdir -p "${CACHE_DIR}"
WORK_DIR="$(mktemp -d "${CACHE_DIR}/work.XXXXXX")"
cleanup() {
    if [[ "${KEEP_BUILD:-0}" != "1" ]]; then
        rm -rf "${WORK_DIR}"
    else
        echo "kept build tree: ${WORK_DIR}" >&2
    fi
}
trap cleanup EXIT

echo "== downloading llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION} sdist" >&2
"${PYTHON}" -m pip download --quiet --no-deps --no-binary :all: \
    "llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION}" -d "${WORK_DIR}/dl"

SDIST="$(ls "${WORK_DIR}"/dl/llama_cpp_python-"${LLAMA_CPP_PYTHON_VERSION}".tar.gz)"
tar -xzf "${SDIST}" -C "${WORK_DIR}"
SRC_DIR="${WORK_DIR}/llama_cpp_python-${LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp"
[[ -f "${SRC_DIR}/CMakeLists.txt" ]] || { echo "error: no vendor/llama.cpp in sdist" >&2; exit 1; }

BUILD_DIR="${WORK_DIR}/build"

# Does -march=native turn AMX on, and does AMX really run here?
amx_mode="${LLAMA_CPP_AMX:-auto}"
EXTRA_FLAGS=""
native_macros="$(echo | c++ -march=native -dM -E -x c++ - 2>/dev/null || true)"
if [[ "${amx_mode}" != "on" && "${native_macros}" == *__AMX_TILE__* ]]; then
    amx_ok=0
    if [[ "${amx_mode}" == "auto" ]]; then
        cat > "${WORK_DIR}/amxprobe.c" <<'EOF'
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <immintrin.h>
int main(void) {
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */)) return 2;
    struct { uint8_t palette, start_row, rsv[14]; uint16_t colsb[16]; uint8_t rows[16]; }
        __attribute__((packed)) cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1; cfg.colsb[0] = 64; cfg.rows[0] = 16;
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_release();
    return 0;
}
EOF
        if c++ -O1 -march=native -x c "${WORK_DIR}/amxprobe.c" -o "${WORK_DIR}/amxprobe" >/dev/null 2>&1 \
            && ( "${WORK_DIR}/amxprobe" ) >/dev/null 2>&1; then
            amx_ok=1
        fi
    fi
    if [[ ${amx_ok} -eq 0 ]]; then
        echo "== AMX advertised but not usable here (LLAMA_CPP_AMX=${amx_mode}): building with -mno-amx-*" >&2
        EXTRA_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    fi
fi
GENERATOR=()
if command -v ninja >/dev/null 2>&1; then
    GENERATOR=(-G Ninja)
fi

# LLAMA_USE_PREBUILT_UI=OFF: otherwise the server's web UI is downloaded at build
# time (fails offline); with it off the server embeds no UI, which benchmarks
# do not need. LLAMA_OPENSSL=OFF: no HTTPS in the server. LLAMA_CURL is
# deprecated in this llama.cpp (ignored unless ON) and kept for older trees.
echo "== configuring (${SRC_DIR})" >&2
nice -n 10 cmake -S "${SRC_DIR}" -B "${BUILD_DIR}" "${GENERATOR[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON \
    -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_CURL=OFF \
    -DGGML_CCACHE=OFF \
    -DCMAKE_C_FLAGS="${EXTRA_FLAGS}" \
    -DCMAKE_CXX_FLAGS="${EXTRA_FLAGS}" >&2

echo "== building ${TARGETS[*]} with -j${JOBS}" >&2
nice -n 10 cmake --build "${BUILD_DIR}" --config Release -j"${JOBS}" \
    --target "${TARGETS[@]}" >&2

mkdir -p "${BIN_DIR}"
for t in "${TARGETS[@]}"; do
    cp -f "${BUILD_DIR}/bin/${t}" "${BIN_DIR}/${t}"
done
echo "llama-cpp-python ${LLAMA_CPP_PYTHON_VERSION} (vendored llama.cpp), built $(date -u +%Y-%m-%dT%H:%M:%SZ), extra flags: '${EXTRA_FLAGS}'" \
    > "${CACHE_DIR}/BUILD_INFO"

all_built || { echo "error: some binaries are missing in ${BIN_DIR}" >&2; exit 1; }
echo "${BIN_DIR}"
