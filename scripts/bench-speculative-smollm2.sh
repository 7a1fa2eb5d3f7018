#!/usr/bin/env bash
# Speculative against plain greedy decoding of SmolLM2-135M-Instruct (Q4_1) with the distilled restricted-head
# drafter (scripts/build-smollm2-draft.sh): whole `multispin generate` processes run alternately (plain,
# speculative, speculative, plain, ...) on held-out prompts: TinyStories validation openings from the slice
# distillation never trains on (its first 64 KiB) and instructions (--chat) that are not among its training
# instructions. Per draft length and prompt set it prints the median, min and max over prompts and pairs of the
# ratio speculative/plain wall time per generated token (below 1 is faster; whole processes, start-up included) and
# the same ratio of the in-process time `--stats` reports (prompt and generation, load excluded), the greedy
# acceptance α (at temperature 0; else the acceptance rate), the draft step and verification pass costs, and the
# ratio the formula predicts from the runs' own counts,
#   (d·t_draft + t_verify) / (e · t_step),  d drafted and e generated tokens per round
# (the gates make d anything from 1 to L, so the geometric E = (1 − α^(L+1)) / (1 − α) of L drafted tokens a round
# no longer applies; d and e are medians over the prompts, columns `drafted` and `tokens`),
# with the load average; and, at temperature 0, checks that every speculative text equals the plain text.
# Build first: `cargo build --release -p multispin`.
#
# α is measured on every held-out prompt at draft length 4 (the first lines); the timed pairs run on the four story
# openings and the first four instructions.
#
# DRAFT is the draft given to `generate --draft`: by default the folder's Q8_0 GGUF copy (model-q8_0.gguf, which
# scripts/build-smollm2-draft.sh writes beside the folder's f32 weights and which starts in milliseconds) where it
# exists, else the folder, run as DRAFT_FORMAT says (`generate --draft-format`, default q8_0: the f32 matrices
# quantised at load; the same Q8_0 bytes as the GGUF copy's, so the same drafts).
# TEMPERATURE (default 0) samples both runs at that temperature with the same seed (`--seed 0`); above 0 the two
# texts are different draws of one distribution (its exactness: scripts/chi2-smollm2.sh), so they are not compared,
# and both runs take `--ignore-eos` (IGNORE_EOS=0 turns it off): each then makes exactly the tokens asked for, where
# otherwise each would end where its own draws reach the end-of-sequence token and the whole-process time per token
# would spread the start-up over different lengths.
# STOP_BELOW passes `--draft-stop-below` to every speculative run (unset: generate's default).
# LENGTHS (default "1 2 3 4 5 6 7 8") lists the draft lengths timed. LOOKUP (default 0: off) gives every speculative
# run `--lookup LOOKUP` (prompt lookup while drafting, docs/runtime.md "Prompt lookup").
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
if [ -z "${DRAFT:-}" ] && [ -e "$draft/model-q8_0.gguf" ]; then
    draft="$draft/model-q8_0.gguf"
fi
draft="${DRAFT:-$draft}"
: "${MULTISPIN_SHARED_DATA:?set it to the folder holding corpora/tinystories_val.txt}"
for f in "$target" "$draft"; do
    [ -e "$f" ] || { echo "skip: $f is absent (scripts/fetch-smollm2.sh, scripts/build-smollm2-draft.sh)"; exit 0; }
done
python3 - "$pairs" "$tokens" "$bin" "$target" "$draft" "$MULTISPIN_SHARED_DATA" "${DRAFT_FORMAT:-q8_0}" \
    "${TEMPERATURE:-0}" "${LOOKUP:-0}" "${IGNORE_EOS:-1}" <<'PY'
import os, re, statistics, subprocess, sys, time
pairs, tokens, binary, target, draft, data, draft_format, temperature, lookup, ignore_eos = \
    int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:8], float(sys.argv[8]), sys.argv[9], sys.argv[10] == "1"
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
if temperature > 0 and ignore_eos:
    base.append("--ignore-eos")
same_text = lambda a, b: temperature > 0 or a == b
def run(cmd):
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return time.perf_counter() - t, out.stdout, out.stderr
def load():
    return os.getloadavg()[0]
def plain(p, extra): return base + ["--prompt", p] + extra
stop_below = os.environ.get("STOP_BELOW")
def spec(p, extra, L):
    return plain(p, extra) + ["--draft", draft, "--draft-format", draft_format, "--draft-len", str(L),
                              "--lookup", lookup] + (["--draft-stop-below", stop_below] if stop_below else [])
num = lambda pat, s: float(re.search(pat, s).group(1))
# Acceptance and pass costs on every held-out prompt (one speculative run each, draft length 4), and the target's
# step from plain runs.
print(f"# {len(stories)} TinyStories openings (held out) and {len(instructions)} instructions (--chat), {tokens} tokens, "
      f"temperature {temperature}, prompt lookup {lookup}{', --ignore-eos' if '--ignore-eos' in base else ''}")
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
timed = {"stories": prompts[:len(stories)], "instructions": prompts[len(stories):len(stories) + 4]}
lengths = [int(x) for x in os.environ.get("LENGTHS", "1 2 3 4 5 6 7 8").split()]
def per_token(cmd):
    wall, _, err = run(cmd + ["--stats"])
    n, s = re.search(r"generated (\d+) tokens in ([0-9.]+) s", err).groups()
    return wall / int(n), float(s) / int(n)
print("draft_len  set           ratio_median  ratio_min  ratio_max  inproc_median  inproc_min  inproc_max  "
      "alpha  drafted  tokens  draft_ms  verify_ms  predicted  load")
for L in lengths:
    for name, group in timed.items():
        alphas, t_d, t_v, steps, drafted, made = [], [], [], [], [], []
        for p, extra in group:
            _, text, err = run(spec(p, extra, L) + ["--stats"])
            if not same_text(text, plain_text[p]):
                sys.exit(f"draft length {L}, prompt {p!r}: speculative text differs from plain decoding")
            a = re.search(r"acceptance ([0-9.]+)", err)
            if a:
                alphas.append(float(a.group(1)))
            t_d.append(num(r"draft ([0-9.]+) ms/token", err) / 1e3)
            t_v.append(num(r"verify ([0-9.]+) ms/round", err) / 1e3)
            rounds = num(r"rounds ([0-9]+)", err)
            drafted.append(num(r"drafted ([0-9]+)", err) / rounds)
            made.append(num(r"generated ([0-9]+) tokens", err) / rounds)
        ratios, inproc = [], []
        for p, extra in group:
            for i in range(pairs):
                if i % 2 == 0:
                    a, b = per_token(plain(p, extra)), per_token(spec(p, extra, L))
                else:
                    b, a = per_token(spec(p, extra, L)), per_token(plain(p, extra))
                ratios.append(b[0] / a[0])
                inproc.append(b[1] / a[1])
                steps.append(a[1])
        alpha = statistics.mean(alphas)
        td, tv = statistics.median(t_d), statistics.median(t_v)
        d, e = statistics.median(drafted), statistics.median(made)
        pred = (d * td + tv) / (e * statistics.median(steps))
        print(f"{L:9d}  {name:12s}  {statistics.median(ratios):12.3f}  {min(ratios):9.3f}  {max(ratios):9.3f}  "
              f"{statistics.median(inproc):13.3f}  {min(inproc):10.3f}  {max(inproc):10.3f}  {alpha:5.3f}  "
              f"{d:7.2f}  {e:6.2f}  "
              f"{1e3 * td:8.3f}  {1e3 * tv:9.2f}  {pred:9.3f}  {load():.2f}", flush=True)
PY
