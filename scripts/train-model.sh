#!/usr/bin/env bash
# The trained-model recipe, one command: a Qwen3-MoE trained on 2 CPU cores from Python's documentation and standard
# library (Debian's python3.11-doc and libpython3.11-stdlib, PSF License), through a byte-level BPE trained with
# `tokenizers`, converted by the pinned llama.cpp's convert_hf_to_gguf.py and quantized by its llama-quantize to
# Q8_0 and Q4_K_M (harness/recipe/). Seeded and resumable: run it again after an interruption and it goes on from
# its last checkpoint; a tqdm bar shows the steps.
#
#   scripts/train-model.sh tiny|bench [--seed N]
#
# Work folder (corpus, tokens, checkpoint): $BMOE_RECIPE_WORK (default ~/.cache/bmoe/recipe/<size>/work).
# Output (GGUF files, recipe.json with every sha256, loss.csv, train.log, LICENSE.corpus): $BMOE_RECIPE_OUT
# (default ~/.cache/bmoe/recipe/<size>/out). Sizes and schedules: harness/recipe/sizes.py.
# Needs: apt-get (downloads, installs nothing), cmake and g++ (llama-quantize), ~1.5 GB for the toolchain venv.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
[ $# -ge 1 ] || { echo "usage: scripts/train-model.sh tiny|bench [--seed N]" >&2; exit 2; }
size="$1"; shift
py="$("$repo/scripts/toolchain-venv.sh")"
tools="$(dirname "$("$repo/scripts/build-llama-perplexity.sh")")"
base="${XDG_CACHE_HOME:-$HOME/.cache}/bmoe/recipe/$size"
export BMOE_LLAMA_SRC="$tools/src" BMOE_LLAMA_QUANTIZE="$tools/llama-quantize"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS="${BMOE_TRAIN_THREADS:-2}"
exec "$py" -m harness.recipe --size "$size" --work "${BMOE_RECIPE_WORK:-$base/work}" \
  --out "${BMOE_RECIPE_OUT:-$base/out}" "$@"
