#!/usr/bin/env bash
# Exactness of speculative sampling on the real pair: SmolLM2-135M-Instruct (Q4_1, scripts/fetch-smollm2.sh) and
# its distilled draft (scripts/build-smollm2-draft.sh), at temperature 1. Runs the spin-runtime `exactness`
# example in release mode: the first two tokens after a fixed story prompt, sampled SAMPLES times (default 4096)
# by the speculative loop at draft length DRAFT_LEN (default 4), against their exact joint distribution under the
# target alone; Pearson's chi-square with its degrees of freedom and p-value, and a negative control (the draft's
# own distribution) that must be rejected. Skips with a message when either file is absent.
#
# Usage: scripts/chi2-smollm2.sh [extra options of the example, e.g. --prompt "The dog" --seed 1]
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${MULTISPIN_CACHE:-$HOME/.cache/multispin}"
target="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
draft="$cache/smollm2-draft"
for f in "$target" "$draft"; do
    [ -e "$f" ] || { echo "skip: $f is absent (scripts/fetch-smollm2.sh, scripts/build-smollm2-draft.sh)"; exit 0; }
done
cargo run --release --quiet -p spin-runtime --example exactness -- --target "$target" --draft "$draft" \
    --draft-format "${DRAFT_FORMAT:-q8_0}" --draft-len "${DRAFT_LEN:-4}" --samples "${SAMPLES:-4096}" "$@"
