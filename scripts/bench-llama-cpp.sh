#!/usr/bin/env bash
# The same GGUF file through `multispin` and llama.cpp, run alternately (A B A B ...), per thread count:
#   1. greedy text: how many leading tokens of our text llama.cpp's text shares (same prompt, same file);
#   2. decoding speed: tokens/s of `multispin generate --stats` (prompt and generation, load excluded) against
#      `llama-bench -p 0 -n N` (generation from an empty context), median ratio with the best and worst pair;
#   3. whole-process wall time of `multispin generate` against `llama-completion` for the same N tokens;
#   4. the cost of one forward pass over n positions after a 64-token prefix, all logits, n = 1 ... 64:
#      `multispin measure pass-cost` against `llama-bench -p n -n 0 -d 64` (prompt processing at depth 64);
#   5. with LONG_PROMPT=FILE, a long context: `multispin generate --stats` with the file's text as the prompt (its
#      P tokens processed, then decoding after them) against `llama-bench -p P -n 0` (prompt processing) and
#      `llama-bench -p 0 -n N -d P` (decoding at depth P): prompt tokens/s and decoding tokens/s, median ratios.
# Build first: `cargo build --release -p multispin`; llama.cpp by its own build script into the cache folder
# (LLAMA_CPP_BIN, default ~/.cache/multispin/llama.cpp/build/bin). ggml's threads spin while they wait, so run this
# on a quiet machine; the load average is printed before and after.
#
# Usage: scripts/bench-llama-cpp.sh MODEL.gguf [PAIRS] [THREADS ...]   (default 7 pairs, threads 1 2)
#   TOKENS (default 128), PROMPT (default "Once upon a time"), PASSES ("1 5 10 20 40 64"; empty skips part 4),
#   LONG_PROMPT (a text file; part 5 runs only with it).
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:?usage: scripts/bench-llama-cpp.sh MODEL.gguf [PAIRS] [THREADS ...]}"
pairs="${2:-7}"
shift $(($# < 2 ? $# : 2))
threads="${*:-1 2}"
llama="${LLAMA_CPP_BIN:-${MULTISPIN_CACHE:-$HOME/.cache/multispin}/llama.cpp/build/bin}"
bin="${MULTISPIN_BIN:-target/release/multispin}"
python3 - "$model" "$pairs" "$threads" "$llama" "$bin" "${TOKENS:-128}" "${PROMPT:-Once upon a time}" \
    "${PASSES-1 5 10 20 40 64}" "${LONG_PROMPT:-}" <<'PY'
import csv, os, re, statistics, subprocess, sys, time
model, pairs, threads, llama, binary, tokens, prompt, passes, long_prompt = sys.argv[1:]
pairs, tokens, threads = int(pairs), int(tokens), [int(t) for t in threads.split()]
passes = [int(n) for n in passes.split()]

def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        sys.exit(f"bench-llama-cpp: {' '.join(cmd)} exited {r.returncode}:\n{r.stderr[-2000:]}")
    return r

def load():
    return " ".join(open("/proc/loadavg").read().split()[:3])

def ours_gen(t, n=tokens):
    return [binary, "generate", "--target", model, "--prompt", prompt, "--max-tokens", str(n),
            "--threads", str(t), "--stats"]

def theirs_completion(t, n=tokens):
    return [f"{llama}/llama-completion", "-m", model, "-p", prompt, "-n", str(n), "-t", str(t), "--temp", "0",
            "-no-cnv", "--no-display-prompt", "--ignore-eos", "--no-warmup"]

def avg_ts(csv_text):
    """llama-bench's mean tokens per second from its CSV output (last row)."""
    rows = list(csv.DictReader(csv_text.strip().splitlines()))
    return float(rows[-1]["avg_ts"])

def stats(xs):
    return f"median {statistics.median(xs):.2f}, min {min(xs):.2f}, max {max(xs):.2f}"

print(f"model {os.path.basename(model)}, {pairs} alternating pairs, threads {threads}, load before: {load()}")

# 1. Text. Ours prints prompt + continuation; llama-completion (without the prompt) prints the continuation.
ours_text = run(ours_gen(threads[0]))
theirs_text = run(theirs_completion(threads[0]))
a = ours_text.stdout.strip()
b = prompt + theirs_text.stdout.rstrip()
common = 0
while common < min(len(a), len(b)) and a[common] == b[common]:
    common += 1
print(f"greedy text: {'identical' if a == b else 'differs'} over the first {common} characters "
      f"(ours {len(a)}, llama.cpp {len(b)})")
if a != b:
    print(f"  ours:      {a[:common + 60]!r}\n  llama.cpp: {b[:common + 60]!r}")

tps_re = re.compile(r"generated (\d+) tokens in ([0-9.]+) s")
for t in threads:
    # 2. Decoding speed.
    ours_tps, theirs_tps, ratio = [], [], []
    bench = [f"{llama}/llama-bench", "-m", model, "-p", "0", "-n", str(tokens), "-t", str(t), "-r", "1", "-o", "csv"]
    for i in range(pairs):
        order = [0, 1] if i % 2 == 0 else [1, 0]
        got = {}
        for which in order:
            if which == 0:
                m = tps_re.search(run(ours_gen(t)).stderr)
                got[0] = int(m.group(1)) / float(m.group(2))
            else:
                got[1] = avg_ts(run(bench).stdout)
        ours_tps.append(got[0]); theirs_tps.append(got[1]); ratio.append(got[0] / got[1])
    print(f"threads {t}: tokens/s multispin {stats(ours_tps)}; llama.cpp {stats(theirs_tps)}; "
          f"ratio multispin/llama.cpp {stats(ratio)}")
    # 3. Whole-process wall time.
    walls = [[], []]
    for i in range(pairs):
        for which in ([0, 1] if i % 2 == 0 else [1, 0]):
            cmd = ours_gen(t) if which == 0 else theirs_completion(t)
            s = time.perf_counter(); run(cmd); walls[which].append(time.perf_counter() - s)
    r = [x / y for x, y in zip(*walls)]
    print(f"threads {t}: whole process, {tokens} tokens: multispin {stats(walls[0])} s; llama-completion "
          f"{stats(walls[1])} s; ratio {stats(r)}")
    # 4. Pass cost after a 64-token prefix.
    for n in passes:
        ours_ms, theirs_ms = [], []
        for i in range(pairs):
            for which in ([0, 1] if i % 2 == 0 else [1, 0]):
                if which == 0:
                    out = run([binary, "measure", "pass-cost", "--target", model, "--positions", str(n),
                               "--prefix-len", "64", "--reps", "3", "--threads", str(t)]).stdout
                    ours_ms.append(float(re.search(r"median ([0-9.]+) ms", out).group(1)))
                else:
                    out = run([f"{llama}/llama-bench", "-m", model, "-p", str(n), "-n", "0", "-d", "64", "-t",
                               str(t), "-r", "3", "-o", "csv"]).stdout
                    theirs_ms.append(1e3 * n / avg_ts(out))
        r = [x / y for x, y in zip(ours_ms, theirs_ms)]
        print(f"threads {t}: pass of {n:2} positions after 64: multispin {stats(ours_ms)} ms; llama.cpp "
              f"{stats(theirs_ms)} ms; ratio {stats(r)}")
    # 5. A long prompt: its processing, then decoding at its depth.
    if long_prompt:
        text = open(long_prompt, encoding="utf-8").read()
        split_re = re.compile(r"prompt of (\d+) tokens and first (\d+) token\(s\) in ([0-9.]+) s; then (\d+) "
                              r"tokens in ([0-9.]+) s")
        ours_pp, ours_tg, theirs_pp, theirs_tg = [], [], [], []
        depth = None
        for i in range(pairs):
            for which in ([0, 1] if i % 2 == 0 else [1, 0]):
                if which == 0:
                    m = split_re.search(run([binary, "generate", "--target", model, "--prompt", text, "--max-tokens",
                                             str(tokens + 1), "--threads", str(t), "--stats"]).stderr)
                    p, ttft, rest, after = int(m[1]), float(m[3]), int(m[4]), float(m[5])
                    depth = depth or p
                    # Greedy decoding takes the first token from the prompt's pass itself: the time to it is the
                    # prompt's processing.
                    ours_tg.append(rest / after)
                    ours_pp.append(p / ttft)
                else:
                    if depth is None:
                        continue
                    theirs_pp.append(avg_ts(run([f"{llama}/llama-bench", "-m", model, "-p", str(depth), "-n", "0",
                                                 "-t", str(t), "-r", "1", "-o", "csv"]).stdout))
                    theirs_tg.append(avg_ts(run([f"{llama}/llama-bench", "-m", model, "-p", "0", "-n", str(tokens),
                                                 "-d", str(depth), "-t", str(t), "-r", "1", "-o", "csv"]).stdout))
        k = min(len(ours_pp), len(theirs_pp))
        print(f"threads {t}: prompt of {depth} tokens: multispin {stats(ours_pp)} tokens/s; llama.cpp "
              f"{stats(theirs_pp)} tokens/s; ratio {stats([x / y for x, y in zip(ours_pp[:k], theirs_pp[:k])])}")
        print(f"threads {t}: decoding {tokens} tokens at depth {depth}: multispin {stats(ours_tg)} tokens/s; "
              f"llama.cpp {stats(theirs_tg)} tokens/s; ratio "
              f"{stats([x / y for x, y in zip(ours_tg[:k], theirs_tg[:k])])}")
print(f"load after: {load()}")
PY
