#!/usr/bin/env bash
# Whole-process wall time of `multispin generate` (plain greedy decoding of stories260K) against llama2.c's run.c,
# run alternately (A B A B ...), with the median ratio and the worst pair; checks that both print the same text.
# Build first: `cargo build --release -p multispin`, and the peer: llama2.c's run.c compiled to /tmp/llama2c-run
# (`gcc -Ofast -march=native -o /tmp/llama2c-run run.c -lm`); another binary can be given with RUN_C.
#
# Usage: scripts/bench-decode.sh [PAIRS] [STEPS] [PROMPT]   (default 15 pairs, 256 positions, "Once upon a time")
#   MULTISPIN_SHARED_DATA must point at the shared data (models/stories260K); extra `generate` flags go in GEN_FLAGS.
set -euo pipefail
cd "$(dirname "$0")/.."
pairs="${1:-15}"
steps="${2:-256}"
prompt="${3:-Once upon a time}"
run_c="${RUN_C:-/tmp/llama2c-run}"
bin="${MULTISPIN_BIN:-target/release/multispin}"
dir="${MULTISPIN_SHARED_DATA:?set MULTISPIN_SHARED_DATA}/models/stories260K"
python3 - "$pairs" "$steps" "$prompt" "$run_c" "$bin" "$dir" "${GEN_FLAGS:-}" <<'PY'
import statistics, subprocess, sys, time
pairs, steps, prompt, run_c, binary, d, extra = int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:]
model, tok = f"{d}/stories260K.bin", f"{d}/tok512.bin"
peer = [run_c, model, "-z", tok, "-t", "0", "-n", str(steps), "-i", prompt]
def text(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
# run.c's -n counts every position from BOS on; generate's --max-tokens counts new tokens only.
want = text(peer).strip()
n_prompt = None
for n in range(steps, 0, -1):
    ours = [binary, "generate", "--target", model, "--tokenizer", tok, "--prompt", prompt, "--max-tokens", str(n)] + extra.split()
    if text(ours).strip() == want:
        n_prompt = steps - n
        break
    if len(text(ours).strip()) < len(want):
        break
if n_prompt is None:
    sys.exit("bench-decode: no --max-tokens reproduces run.c's text")
print(f"same text with --max-tokens {steps - n_prompt} (run.c -n {steps})")
def wall(cmd):
    t = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t
ratios, ts_a, ts_b = [], [], []
for i in range(pairs):
    a, b = (wall(ours), wall(peer)) if i % 2 == 0 else tuple(reversed((wall(peer), wall(ours))))
    ts_a.append(a); ts_b.append(b); ratios.append(a / b)
ms = lambda x: f"{1e3 * x:.1f} ms"
print(f"multispin generate: median {ms(statistics.median(ts_a))}, run.c: median {ms(statistics.median(ts_b))}")
print(f"ratio multispin/run.c over {pairs} alternating pairs: median {statistics.median(ratios):.3f}, "
      f"best {min(ratios):.3f}, worst {max(ratios):.3f}")
PY
