#!/usr/bin/env bash
# Speculative against plain greedy decoding of stories260K with the committed distilled draft (models/), whole
# `multispin generate` processes run alternately (plain, speculative, plain, ...), for draft lengths 1..8: the
# median ratio speculative/plain per draft length, its worst pair, and a check that the texts are identical.
# Build first: `cargo build --release -p multispin`.
#
# Usage: scripts/bench-speculative.sh [PAIRS] [TOKENS]   (default 10 pairs, 256 tokens)
set -euo pipefail
cd "$(dirname "$0")/.."
pairs="${1:-10}"
tokens="${2:-256}"
bin="${MULTISPIN_BIN:-target/release/multispin}"
python3 - "$pairs" "$tokens" "$bin" <<'PY'
import statistics, subprocess, sys, time
pairs, tokens, binary = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
base = [binary, "generate", "--target", "models/stories260K.bin", "--tokenizer", "models/tok512.bin",
        "--prompt", "Once upon a time", "--max-tokens", str(tokens)]
def run(cmd):
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return time.perf_counter() - t, out.stdout, out.stderr
plain_text = run(base)[1]
print("draft_len  median spec/plain  worst  acceptance")
for L in range(1, 9):
    spec = base + ["--draft", "models/draft-2x32.bin", "--draft-len", str(L)]
    _, text, err = run(spec + ["--stats"])
    if text != plain_text:
        sys.exit(f"draft length {L}: speculative text differs from plain decoding")
    acc = next((l.split("acceptance ")[1].split(" |")[0] for l in err.splitlines() if "acceptance" in l), "n/a")
    ratios = []
    for i in range(pairs):
        if i % 2 == 0:
            p, s = run(base)[0], run(spec)[0]
        else:
            s, p = run(spec)[0], run(base)[0]
        ratios.append(s / p)
    print(f"{L:9d}  {statistics.median(ratios):17.3f}  {max(ratios):5.3f}  {acc}")
PY
