#!/usr/bin/env bash
# Paper A's Fig. 6 on real compute (docs/system.md, "Paper A's baselines"): `multispin simulate --compute measured
# --sweep-devices 1,2,4,8`, the Multi-SPIN scheme (SCHEME, default exact) against Cen-SPIN, P2P-SPIN and plain
# batched decoding on the same prompts, seeds and drop, at each K. Every further argument goes to simulate (the
# models: `--target … --draft …` or `--self-draft-layers N`; default the embedded stories260K and its distilled
# draft). Outputs under target/fig6/ (FIG6_OUT): K<k>/ per device count, fig6.csv and fig6-sweep.svg over all.
# Build first: `cargo build --release -p multispin` (or give another binary with MULTISPIN_BIN); KS changes the
# device counts (default 1,2,4,8).
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${MULTISPIN_BIN:-target/release/multispin}"
out="${FIG6_OUT:-target/fig6}"
"$bin" simulate --sweep-devices "${KS:-1,2,4,8}" --compute measured --scheme "${SCHEME:-exact}" \
    --compare cen-spin,p2p-spin,plain --out "$out" "$@" | awk '/^Fig. 6/ { p = 1 } /^per device/ { p = 0 } p'
cat "$out/fig6.csv"
