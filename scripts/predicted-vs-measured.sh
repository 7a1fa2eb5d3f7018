#!/usr/bin/env bash
# The prediction check of docs/unified.md ("Prediction against measurement"): every per-round planning scheme of
# both papers and the unified planner, run by `multispin simulate` on the embedded real models (stories260K target,
# the distilled 2 × 32 draft) with paper B's Qwen compute profile and 10 MHz, 8 devices, 128 tokens each, virtual
# clock. Runs seed 0 greedy (default prior α₀ = 0.7), the same with α₀ = 0.4 (near the realised acceptance, to
# isolate the estimate's lag), temperature 1, and greedy seeds 1 and 2; prints each run's prediction-check table.
# Outputs (traces, summaries, prediction.csv/svg) go under target/predicted-vs-measured/.
# Build first: `cargo build --release -p multispin` (or give another binary with MULTISPIN_BIN).
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${MULTISPIN_BIN:-target/release/multispin}"
out=target/predicted-vs-measured
schemes=greedy,uniform,comp-only,exact,paper-alg1,homo,uni-bw,fixed,unified
run() {
    local name=$1
    shift
    echo "== $name: multispin simulate --devices 8 --max-tokens 128 --scheme best --compare $schemes $*"
    "$bin" simulate --devices 8 --max-tokens 128 --scheme best --compare "$schemes" --out "$out/$name" "$@" \
        | sed -n '/^prediction check/,$p'
}
run greedy-seed0
run greedy-seed0-prior0.4 --alpha-prior 0.4
run sampled-seed0 --temperature 1
run greedy-seed1 --seed 1
run greedy-seed2 --seed 2
