#!/usr/bin/env bash
# Rebuilds the distilled drafter of SmolLM2-135M-Instruct (Q4_1, scripts/fetch-smollm2.sh) into the cache folder:
# $MULTISPIN_CACHE/smollm2-draft (default ~/.cache/multispin), a model folder (config.json, model.safetensors) with
# a restricted head over the target's 4,096 most frequent tokens (docs/runtime.md, "Restricted draft head"). The
# exact command is below; it runs under `nice -n 19` and prints a progress line every 5 s. Then it prints the
# sha256 of both files and compares them with the ones this command gave when it was committed (a mismatch is
# reported, not fatal: thread counts and CPUs may round differently).
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
nice -n 19 cargo xtask distill --target "$target" --out "$out" --head-vocab 4096 --top-k 32 --story-seqs 512 \
    --seq-len 128 --dim 256 --hidden 768 --layers 2 --heads 4 --kv-heads 2 --steps STEPS --batch 16 --lr 3e-3 \
    --seed 0
expected_config="CONFIG_SHA"
expected_model="MODEL_SHA"
got_config=$(sha256sum "$out/config.json" | cut -d' ' -f1)
got_model=$(sha256sum "$out/model.safetensors" | cut -d' ' -f1)
echo "sha256 $got_config  $out/config.json"
echo "sha256 $got_model  $out/model.safetensors"
if [ "$got_config" = "$expected_config" ] && [ "$got_model" = "$expected_model" ]; then
    echo "both files match the committed hashes"
else
    echo "note: the hashes differ from the committed ones ($expected_config, $expected_model)"
fi
