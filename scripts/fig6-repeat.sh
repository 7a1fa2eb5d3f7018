#!/usr/bin/env bash
# Fig. 6 on real compute, repeated: `scripts/fig6-sweep.sh` REPEATS times (default 3) into run-1, run-2, … under
# FIG6_OUT (default target/fig6-repeat), then one table per K of every scheme's goodput over plain batched decoding's
# in the same run, median [min–max] over the runs, and its mean draft length. Measured passes on a shared machine
# vary by tens of percent between runs a minute apart, so one sweep's ratio is not a result; the worst run is
# printed beside the median. Every further argument goes to fig6-sweep.sh (and so to `multispin simulate`), e.g.
#
#   scripts/fig6-repeat.sh --target ~/.cache/multispin/SmolLM2-135M-Instruct.Q4_1.gguf \
#       --draft ~/.cache/multispin/smollm2-draft --draft-format q8_0 --compare best --max-tokens 256 --lookup 4
#
# Build first: `cargo build --release -p multispin` (or give another binary with MULTISPIN_BIN); SCHEME and KS as
# for fig6-sweep.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats="${REPEATS:-3}"
out="${FIG6_OUT:-target/fig6-repeat}"
case "$repeats" in
    '' | *[!0-9]* | 0) echo "error: REPEATS must be a whole number ≥ 1, got '$repeats'" >&2; exit 2 ;;
esac
for i in $(seq 1 "$repeats"); do
    echo "== run $i of $repeats ($(uptime | sed 's/.*load average/load average/'))" >&2
    mkdir -p "$out/run-$i"
    FIG6_OUT="$out/run-$i" scripts/fig6-sweep.sh "$@" > "$out/run-$i/sweep.log" 2>&1 || {
        echo "error: run $i failed; its output is in $out/run-$i/sweep.log" >&2
        exit 1
    }
done
python3 - "$out" "$repeats" <<'PY'
import csv, statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])
runs = []
for i in range(1, repeats + 1):
    with open(f"{out}/run-{i}/fig6.csv", encoding="utf-8") as f:
        runs.append({(int(r["devices"]), r["scheme"]): r for r in csv.DictReader(f)})
ks = sorted({k for run in runs for k, _ in run})
schemes = []
for run in runs:
    for _, s in run:
        if s not in schemes:
            schemes.append(s)
def spread(values):
    if not values:
        return "n/a"
    return f"{statistics.median(values):.2f} [{min(values):.2f}–{max(values):.2f}]"
print(f"goodput / plain's in the same run, median [min–max] over {repeats} runs; mean draft length likewise")
for k in ks:
    print(f"\nK = {k}")
    print(f"{'scheme':<10} {'goodput / plain':>22} {'mean L':>22}")
    for s in schemes:
        if s == "plain":
            continue
        ratios, lengths = [], []
        for run in runs:
            r, p = run.get((k, s)), run.get((k, "plain"))
            if r is None or p is None or float(p["goodput"]) <= 0:
                continue
            ratios.append(float(r["goodput"]) / float(p["goodput"]))
            lengths.append(float(r["mean_draft_len"]))
        print(f"{s:<10} {spread(ratios):>22} {spread(lengths):>22}")
PY
