#!/usr/bin/env bash
# The GPU run, on a lent machine in one call (under 8 minutes): environment probe and the
# card's measured ceilings, the Triton kernel and GPU-path tests (bf16 included), parity
# with transformers on the same random weights, and the Llama-3.1-8B-shape benchmark (bf16,
# FP8, transformers beside them). Here first: benchmarks/gpu/prepare.sh; then the device
# tool's run with carry [".whl", ".gpu"] and command `bash benchmarks/gpu/run.sh`.
# Writes under $OUT: summary.md, probe.json, parity.json, bench.json, steps.txt, run.log.
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
step probe 90 python3 benchmarks/gpu/probe.py --out "$OUT/probe.json"
step kernels 150 python3 -m pytest -q -p no:cacheprovider -x tests/triton
step parity 120 python3 benchmarks/gpu/parity.py --out "$OUT/parity.json"
step bench 300 python3 benchmarks/gpu/bench.py --probe "$OUT/probe.json" --out "$OUT/bench.json"
{
    echo "# GPU run $(date -u +%F) on $(nvidia-smi --query-gpu=name --format=csv,noheader)"
    cat "$OUT/steps.txt"
    [ -f "$OUT/bench.md" ] && cat "$OUT/bench.md"
} > "$OUT/summary.md"
rm -f "$OUT/bench.md"
cat "$OUT/summary.md"
