#!/usr/bin/env bash
# The networked system on the real clock against the virtual clock (docs/system.md, "Real clock"), with real
# models: SmolLM2-135M-Instruct (Q4_1, scripts/fetch-smollm2.sh) at the server and its distilled draft
# (scripts/build-smollm2-draft.sh, DRAFT_FORMAT default q8_0) on every device, K = 2 and 4 devices (KS), TOKENS
# tokens each (default 64), scheme SCHEME (default best), the server's planning budget PLAN_BUDGET_MS (default 2,
# serve's own default; `none`: unbounded), greedy, seed 0, held-out TinyStories openings as prompts
# (device k gets the k-th; the first 64 KiB of TinyStories validation, which distillation never trains on).
#
# For each K it runs, one after the other:
#   1. `multispin simulate --clock virtual --compute measured`: one process; each device's drafting timed one
#      device at a time, the server's passes measured, air times modelled;
#   2. `multispin serve --clock real` and K `multispin device` processes: air times really waited, everything on
#      the wall clock. The two cores are split: the server alone on CPU 1 (`taskset -c 1`, `--threads 1`), all K
#      devices on CPU 0 (`taskset -c 0`, `--threads 1` each), so the server's passes never share a core with
#      drafting, and the K devices share one core as K phones would not (their drafting times, in the trace, are
#      what that sharing gives). Devices start 2 s apart, so they join in order and device k gets the server's
#      drop distance k, as in the virtual run.
# Prints both scheme tables per K and the server's planning time per round; the server's round trace goes to target/real-clock/K<k>/trace.jsonl.
# Build first: `cargo build --release -p multispin`. Needs MULTISPIN_SHARED_DATA (corpora/tinystories_val.txt).
#
# Usage: scripts/real-clock-smollm2.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${MULTISPIN_BIN:-target/release/multispin}"
cache="${MULTISPIN_CACHE:-$HOME/.cache/multispin}"
target="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
draft="$cache/smollm2-draft"
tokens="${TOKENS:-64}"
scheme="${SCHEME:-best}"
format="${DRAFT_FORMAT:-q8_0}"
budget="${PLAN_BUDGET_MS:-2}"
out="${REAL_CLOCK_OUT:-target/real-clock}"
: "${MULTISPIN_SHARED_DATA:?set it to the folder holding corpora/tinystories_val.txt}"
for f in "$target" "$draft"; do
    [ -e "$f" ] || { echo "skip: $f is absent (scripts/fetch-smollm2.sh, scripts/build-smollm2-draft.sh)"; exit 0; }
done
mkdir -p "$out"
python3 - "$MULTISPIN_SHARED_DATA/corpora/tinystories_val.txt" > "$out/prompts.txt" <<'PY'
import sys
held = open(sys.argv[1], encoding="utf-8").read()[:65536]
paras = [p.strip() for p in held.split("\n") if len(p.strip()) > 200]
print("\n".join(" ".join(p.split()[:12]) for p in paras[:8]))
PY
port=7979
for k in ${KS:-2 4}; do
    dir="$out/K$k"
    mkdir -p "$dir"
    echo "== K = $k, virtual clock, compute measured (load $(cut -d' ' -f1 /proc/loadavg))"
    "$bin" simulate --clock virtual --compute measured --devices "$k" --target "$target" --draft "$draft" \
        --draft-format "$format" --scheme "$scheme" --max-tokens "$tokens" --prompts "$out/prompts.txt" \
        --out "$dir/virtual" | awk '/^scheme / { p = 1 } /^$/ { p = 0 } p'
    echo "== K = $k, real clock: serve on CPU 1, $k devices on CPU 0 (load $(cut -d' ' -f1 /proc/loadavg))"
    port=$((port + 1))
    taskset -c 1 "$bin" serve --threads 1 --listen "127.0.0.1:$port" --clock real --devices "$k" \
        --target "$target" --scheme "$scheme" --max-tokens "$tokens" --plan-budget-ms "$budget" \
        --trace "$dir/trace.jsonl" \
        > "$dir/serve.out" 2> "$dir/serve.err" &
    server=$!
    for _ in $(seq 100); do grep -q "listening on" "$dir/serve.err" 2>/dev/null && break; sleep 0.1; done
    pids=()
    for i in $(seq 0 $((k - 1))); do
        prompt="$(sed -n "$((i + 1))p" "$out/prompts.txt")"
        taskset -c 0 "$bin" device --threads 1 --connect "127.0.0.1:$port" --draft "$draft" \
            --draft-format "$format" --tokenizer "$target" --prompt "$prompt" \
            > "$dir/device$i.out" 2> "$dir/device$i.err" &
        pids+=($!)
        sleep 2
    done
    for p in "${pids[@]}"; do wait "$p" || { echo "a device failed:"; cat "$dir"/device*.err; exit 1; }; done
    wait "$server" || { echo "the server failed:"; cat "$dir/serve.err"; exit 1; }
    cat "$dir/serve.out"
    python3 - "$dir/trace.jsonl" <<'PY'
import json, statistics, sys
plan = sorted(json.loads(line).get("plan_s", 0.0) * 1e3 for line in open(sys.argv[1]))
print(f"planning per round, ms: median {statistics.median(plan):.2f}, max {plan[-1]:.2f} ({len(plan)} rounds)")
PY
done
