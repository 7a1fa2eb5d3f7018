#!/usr/bin/env bash
# GPU check for spin-runtime, for a machine with an NVIDIA GPU and the CUDA toolkit (nvcc) when one is lent.
# Builds with `--features cuda`, runs the runtime tests, then the batched-verification latency measurement on the
# GPU (stories260K when MULTISPIN_SHARED_DATA or ../shared/data has it). Budget: under 8 minutes.
#
# Usage: scripts/gpu-check.sh [OUT_DIR]      (results, CSV and SVG go to OUT_DIR, default target/gpu-check)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/gpu-check}"
mkdir -p "$out"
export CARGO_INCREMENTAL=0
# candle re-reads /proc/cpuinfo on every CPU matmul unless this is set; the test binaries do not set it themselves.
# At most 256: the binaries refuse a larger pool (spin_runtime::load::MAX_THREADS).
cores="$(nproc)"
export RAYON_NUM_THREADS="${RAYON_NUM_THREADS:-$((cores < 256 ? cores : 256))}"
if [ -z "${MULTISPIN_SHARED_DATA:-}" ] && [ -d ../shared/data ]; then
    export MULTISPIN_SHARED_DATA="$(cd ../shared/data && pwd)"
fi
command -v nvcc >/dev/null || { echo "gpu-check: nvcc not found (the cuda feature needs the CUDA toolkit)"; exit 2; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/gpu.txt"

start=$(date +%s)
# One release build of everything the check runs, so the tests and the measurement share it.
timeout 420 cargo build --release --locked -p multispin --features cuda 2>&1 | tail -3
timeout 240 cargo test --release --locked -p spin-runtime --features cuda 2>&1 | tee "$out/tests.txt" | grep -E "^test result|FAILED|panicked" || true
grep -q "FAILED" "$out/tests.txt" && { echo "gpu-check: runtime tests failed"; exit 1; }

target_model=""
if [ -n "${MULTISPIN_SHARED_DATA:-}" ] && [ -f "$MULTISPIN_SHARED_DATA/models/stories260K/stories260K.bin" ]; then
    target_model="$MULTISPIN_SHARED_DATA/models/stories260K/stories260K.bin"
    tok="$MULTISPIN_SHARED_DATA/models/stories260K/tok512.bin"
fi
if [ -n "$target_model" ]; then
    timeout 120 ./target/release/multispin measure verify-latency --target "$target_model" --tokenizer "$tok" \
        --max-k 16 --draft-len 8 --prefix-len 64 --reps 9 --out "$out" | tee "$out/verify_latency.txt"
else
    echo "gpu-check: no stories260K model (set MULTISPIN_SHARED_DATA); skipped verify-latency"
fi
echo "gpu-check: done in $(( $(date +%s) - start )) s; results in $out"
