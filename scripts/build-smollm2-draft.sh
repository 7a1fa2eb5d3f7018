#!/usr/bin/env bash
# Rebuilds the distilled drafter of SmolLM2-135M-Instruct (Q4_1, scripts/fetch-smollm2.sh) into the cache folder:
# $MULTISPIN_CACHE/smollm2-draft (default ~/.cache/multispin), a model folder (config.json, model.safetensors) with
# a restricted head over the target's 4,096 most frequent tokens (docs/runtime.md, "Restricted draft head"). The
# exact command is below; it runs under `nice -n 19` and prints a progress line every 5 s. Then it prints the
# sha256 of both files and compares them with the ones this command gave when it was committed (a mismatch is
# reported, not fatal: thread counts and CPUs may round differently).
# The draft whose hashes are below came from the same options with `--steps 5000 --minutes 12` (a 12-minute time box at load
# average ≈ 5–12, which stopped after 414 steps; `--steps 414` reproduces it without the box): about 11 min of
# generating and caching the target's distributions, 12 min of training.
# Needs MULTISPIN_SHARED_DATA (the folder holding corpora/tinystories_val.txt).
#
# Usage: scripts/build-smollm2-draft.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${MULTISPIN_CACHE:-$HOME/.cache/multispin}"
target="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
out="$cache/smollm2-draft"
: "${MULTISPIN_SHARED_DATA:?set it to the folder holding corpora/tinystories_val.txt}"
[ -e "$target" ] || { echo "error: $target is absent: run scripts/fetch-smollm2.sh first" >&2; exit 1; }
nice -n 19 cargo xtask distill --target "$target" --out "$out" --head-vocab 4096 --top-k 32 --story-seqs 384 \
    --seq-len 128 --dim 256 --hidden 768 --layers 2 --heads 4 --kv-heads 2 --steps 414 --batch 16 --lr 3e-3 \
    --seed 0
expected_config="29450e3a65324fd8f4666f063352f71c245b0b59dbbf968fa15fadc7446609db"
expected_model="daba66f7fa8b028c834e12d90a9896a335c225ed8a8400a2ec9b078b04edde14"
got_config=$(sha256sum "$out/config.json" | cut -d' ' -f1)
got_model=$(sha256sum "$out/model.safetensors" | cut -d' ' -f1)
echo "sha256 $got_config  $out/config.json"
echo "sha256 $got_model  $out/model.safetensors"
if [ "$got_config" = "$expected_config" ] && [ "$got_model" = "$expected_model" ]; then
    echo "both files match the committed hashes"
else
    echo "note: the hashes differ from the committed ones ($expected_config, $expected_model)"
fi
