#!/usr/bin/env bash
# The GPU run, on a lent machine in one call (the steps' limits add up to 475 s): environment
# probe and the card's measured ceilings, the Triton kernel and GPU-path tests (bf16 included,
# LoRA and the families beyond Llama at the model level), parity with transformers on the
# same random weights, the Llama-3.1-8B-shape benchmark (bf16, FP8, transformers beside
# them), then parity of a dense (Qwen3) and a mixture-of-experts (Qwen3-MoE) shape. Here
# first: benchmarks/gpu/prepare.sh; then the device tool's run with carry [".whl", ".gpu"],
# timeout_s 540 and command `bash benchmarks/gpu/run.sh`.
# Writes under $OUT: summary.md, probe.json, parity.json, bench.json, parity-families.json,
# steps.txt, run.log.
set -uo pipefail
OUT=${OUT:-/tmp/tokenmill-gpu}
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/.gpu/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv

step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2 start=$SECONDS
    shift 2
    echo "=== $name"
    timeout "$limit" "$@"
    echo "$name: rc=$? in $((SECONDS - start)) s" | tee -a "$OUT/steps.txt"
}
step probe 40 python3 benchmarks/gpu/probe.py --out "$OUT/probe.json"
# the families' engine and FP8 runs are left to parity-families below
step kernels 110 python3 -m pytest -q -p no:cacheprovider -x tests/triton \
    -k "not engine_on_the_triton_backend and not fp8_weights_run_the_families"
step parity 55 python3 benchmarks/gpu/parity.py --shapes llama-3.1-8b-2l qwen2.5-7b-2l \
    --out "$OUT/parity.json"
step bench 220 python3 benchmarks/gpu/bench.py --probe "$OUT/probe.json" --out "$OUT/bench.json"
step parity-families 50 python3 benchmarks/gpu/parity.py \
    --shapes qwen3-0.6b-2l qwen3-30b-a3b-2l-32e --out "$OUT/parity-families.json"
{
    echo "# GPU run $(date -u +%F) on $(nvidia-smi --query-gpu=name --format=csv,noheader)"
    cat "$OUT/steps.txt"
    [ -f "$OUT/bench.md" ] && cat "$OUT/bench.md"
} > "$OUT/summary.md"
rm -f "$OUT/bench.md"
cat "$OUT/summary.md"
