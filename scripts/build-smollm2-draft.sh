#!/usr/bin/env bash
# Rebuilds the distilled drafter of SmolLM2-135M-Instruct (Q4_1, scripts/fetch-smollm2.sh) into the cache folder:
# $MULTISPIN_CACHE/smollm2-draft (default ~/.cache/multispin), a model folder (config.json, model.safetensors) with
# a restricted head over the target's 4,096 most frequent tokens (docs/runtime.md, "Restricted draft head"), made of
# the target's layer 0 alone (width 576: one layer trained for 1,000 steps agrees more often than two layers
# trained for 600 in the same time, docs/runtime.md "A one-layer draft") and trained on held-in stories, the
# target's greedy continuations of 1,536 held-in story openings and its answers to 256 instructions (one greedy,
# two sampled). The exact command is below; it prints a progress line every 5 s and the time of each phase. Then it
# writes the folder's model again as model-q8_0.gguf beside it (the spin-runtime `to_gguf` example: Q8_0 matrices,
# the same bytes `generate --draft-format q8_0` quantises the folder to at every start, and the restricted head's
# ids in the metadata; `generate --draft` takes either, the GGUF file starts in milliseconds), prints the sha256
# of the folder's two files and compares them with the ones this command gave when it was committed (a mismatch is
# reported, not fatal: thread counts and CPUs may round differently), then the GGUF file's.
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
start=$(date +%s)
cargo xtask distill --target "$target" --out "$out" --head-vocab 4096 --top-k 32 --story-seqs 256 \
    --openings 1536 --instructions 256 --seq-len 128 --init-layers 0 --steps 1000 --batch 16 --lr 1e-3 \
    --lr-schedule cosine --seed 0 --cache-file "$cache/smollm2-draft-topk.bin"
cargo run --release -q -p spin-runtime --example to_gguf -- "$out" "$out/model-q8_0.gguf"
echo "built in $(( $(date +%s) - start )) s (release build of the examples included when they were not built yet)"
expected_config="563b374b0721c732a2955fde394215c4b65fc60ac17d34fd46886aaecdf3104b"
expected_model="d136003d6b52c1f450041154f386cd93098b1e57c4d87143cec665a11ccfd3a4"
got_config=$(sha256sum "$out/config.json" | cut -d' ' -f1)
got_model=$(sha256sum "$out/model.safetensors" | cut -d' ' -f1)
echo "sha256 $got_config  $out/config.json"
echo "sha256 $got_model  $out/model.safetensors"
if [ "$got_config" = "$expected_config" ] && [ "$got_model" = "$expected_model" ]; then
    echo "both files match the committed hashes"
else
    echo "note: the hashes differ from the committed ones ($expected_config, $expected_model)"
fi
sha256sum "$out/model-q8_0.gguf"
