#!/usr/bin/env bash
# Speculative against plain greedy decoding of SmolLM2-135M-Instruct (Q4_1) with the distilled restricted-head
# drafter (scripts/build-smollm2-draft.sh): whole `multispin generate` processes run alternately (plain,
# speculative, plain, ...), for draft lengths 1..8, on held-out prompts: TinyStories validation openings from the
# slice distillation never trains on (its first 64 KiB) and instructions (--chat) that are not among its training
# instructions. Prints per draft length the median, min and max ratio speculative/plain wall time per generated
# token (below 1 is faster), the greedy acceptance α (at temperature 0; else the acceptance rate), the draft step and verification pass costs, and the
# ratio the formula predicts,
#   (L·t_draft + t_verify(L+1)) / (E[tokens per round] · t_step),  E = (1 − α^(L+1)) / (1 − α),
# with the load average; and, at temperature 0, checks that every speculative text equals the plain text.
# Build first: `cargo build --release -p multispin`.
#
# α is measured on every held-out prompt at draft length 4 (the table's alpha_all); per draft length, α, the pass
# costs and the timed pairs come from the first story opening and the first instruction.
#
# The draft runs as DRAFT_FORMAT says (`generate --draft-format`, default q8_0: its f32 matrices quantised at load).
# TEMPERATURE (default 0) samples both runs at that temperature with the same seed (`--seed 0`); above 0 the two
# texts are different draws of one distribution (its exactness: scripts/chi2-smollm2.sh), so they are not compared.
#
# Usage: scripts/bench-speculative-smollm2.sh [PAIRS] [TOKENS]   (default 2 pairs per prompt, 256 tokens)
set -euo pipefail
cd "$(dirname "$0")/.."
pairs="${1:-2}"
tokens="${2:-256}"
bin="${MULTISPIN_BIN:-target/release/multispin}"
cache="${MULTISPIN_CACHE:-$HOME/.cache/multispin}"
target="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
draft="$cache/smollm2-draft"
: "${MULTISPIN_SHARED_DATA:?set it to the folder holding corpora/tinystories_val.txt}"
for f in "$target" "$draft"; do
    [ -e "$f" ] || { echo "skip: $f is absent (scripts/fetch-smollm2.sh, scripts/build-smollm2-draft.sh)"; exit 0; }
done
python3 - "$pairs" "$tokens" "$bin" "$target" "$draft" "$MULTISPIN_SHARED_DATA" "${DRAFT_FORMAT:-q8_0}" \
    "${TEMPERATURE:-0}" <<'PY'
import os, re, statistics, subprocess, sys, time
pairs, tokens, binary, target, draft, data, draft_format, temperature = \
    int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:8], float(sys.argv[8])
held = open(os.path.join(data, "corpora/tinystories_val.txt"), encoding="utf-8").read()[:65536]
paras = [p.strip() for p in held.split("\n") if len(p.strip()) > 200]
stories = [" ".join(p.split()[:12]) for p in paras[:4]]
instructions = [
    "Write a short story about a robot who learns to paint.",
    "Explain how the heart pumps blood.",
    "What are three benefits of regular exercise?",
    "Describe a sunrise over the mountains.",
    "How do airplanes stay in the air?",
    "Give me a simple recipe for tomato soup.",
    "What is the difference between a frog and a toad?",
    "Write a letter to a friend about a summer holiday.",
    "Why do cats purr?",
    "Explain what a computer program is.",
]
prompts = [(s, []) for s in stories] + [(i, ["--chat"]) for i in instructions]
base = [binary, "generate", "--target", target, "--max-tokens", str(tokens), "--temperature", str(temperature)]
same_text = lambda a, b: temperature > 0 or a == b
def run(cmd):
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return time.perf_counter() - t, out.stdout, out.stderr
def load():
    return os.getloadavg()[0]
def plain(p, extra): return base + ["--prompt", p] + extra
def spec(p, extra, L):
    return plain(p, extra) + ["--draft", draft, "--draft-format", draft_format, "--draft-len", str(L)]
num = lambda pat, s: float(re.search(pat, s).group(1))
# Acceptance and pass costs on every held-out prompt (one speculative run each, draft length 4), and the target's
# step from plain runs.
print(f"# {len(stories)} TinyStories openings (held out) and {len(instructions)} instructions (--chat), {tokens} tokens, "
      f"temperature {temperature}")
plain_text, t_step = {}, []
for p, extra in prompts:
    _, text, err = run(plain(p, extra) + ["--stats"])
    plain_text[p] = text
    n, s = re.search(r"generated (\d+) tokens in ([0-9.]+) s", err).groups()
    t_step.append(float(s) / int(n))
t_step = statistics.median(t_step)
print(f"target step (plain decoding, in-process, median over prompts): {1e3 * t_step:.2f} ms  load {load():.2f}")
alphas = {"s": [], "i": []}
for p, extra in prompts:
    _, text, err = run(spec(p, extra, 4) + ["--stats"])
    if not same_text(text, plain_text[p]):
        sys.exit(f"draft length 4, prompt {p!r}: speculative text differs from plain decoding")
    alphas["i" if extra else "s"].append(num(r"acceptance ([0-9.]+)", err))
print(f"greedy acceptance at draft length 4: stories {statistics.mean(alphas['s']):.3f} "
      f"(per prompt {[round(a, 3) for a in alphas['s']]}), instructions {statistics.mean(alphas['i']):.3f} "
      f"(per prompt {[round(a, 3) for a in alphas['i']]})  load {load():.2f}")
timed = [prompts[0], prompts[len(stories)]]
print("draft_len  ratio_median  ratio_min  ratio_max  alpha_story  alpha_instr  draft_ms  verify_ms  predicted  load")
for L in range(1, 9):
    alphas, t_d, t_v = {"s": [], "i": []}, [], []
    for p, extra in timed:
        _, text, err = run(spec(p, extra, L) + ["--stats"])
        if not same_text(text, plain_text[p]):
            sys.exit(f"draft length {L}, prompt {p!r}: speculative text differs from plain decoding")
        a = re.search(r"acceptance ([0-9.]+)", err)
        if a:
            alphas["i" if extra else "s"].append(float(a.group(1)))
        t_d.append(num(r"draft ([0-9.]+) ms/token", err) / 1e3)
        t_v.append(num(r"verify ([0-9.]+) ms/round", err) / 1e3)
    # Wall time per generated token (at temperature 0 both texts are the same, so this is the wall-time ratio).
    def per_token(cmd):
        wall, _, err = run(cmd + ["--stats"])
        return wall / int(re.search(r"generated (\d+) tokens", err).group(1))
    ratios = []
    for p, extra in timed:
        for i in range(pairs):
            if i % 2 == 0:
                a, b = per_token(plain(p, extra)), per_token(spec(p, extra, L))
            else:
                b, a = per_token(spec(p, extra, L)), per_token(plain(p, extra))
            ratios.append(b / a)
    alpha = statistics.mean(alphas["s"] + alphas["i"])
    e = (1 - alpha ** (L + 1)) / (1 - alpha) if alpha < 1 else L + 1
    td, tv = statistics.median(t_d), statistics.median(t_v)
    pred = (L * td + tv) / (e * t_step)
    print(f"{L:9d}  {statistics.median(ratios):12.3f}  {min(ratios):9.3f}  {max(ratios):9.3f}  "
          f"{statistics.mean(alphas['s']):13.3f}  {statistics.mean(alphas['i']):11.3f}  {1e3 * td:8.3f}  "
          f"{1e3 * tv:9.2f}  {pred:9.3f}  {load():.2f}", flush=True)
PY
