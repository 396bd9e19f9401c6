#!/usr/bin/env bash
# The real-toolchain models: for each MoE family transformers 4.57.6 has a class for and the pinned llama.cpp converter
# converts (harness/toolchain/families.py), a tiny seeded random-init checkpoint built with transformers' own config
# and class, converted by the pinned convert_hf_to_gguf.py (F16) and quantized by the pinned llama-quantize to Q8_0,
# Q4_K_M and IQ4_XS; qwen3moe also as 3 shards (Q8_0). tests/gates/test_real_toolchain.py gates them.
#
#   scripts/real-toolchain-models.sh OUT_DIR [--only FAMILY ...] [--publish DIR]
#
# OUT_DIR/models.json lists the files (sha256, llama-quantize's fallbacks, seconds); a second run with the same
# sources and tools does nothing. --publish DIR also copies two families' quantized files (olmoe whole, qwen3moe with
# its Q8_0 in shards) into DIR/tiny-<family>-GGUF/, laid out as a hub repository holds them.
# Needs the toolchain venv (scripts/toolchain-venv.sh) and llama-quantize (scripts/build-llama-perplexity.sh, ~15
# min the first time); both are set up here when missing.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
[ $# -ge 1 ] || { echo "usage: scripts/real-toolchain-models.sh OUT_DIR [--only FAMILY ...] [--publish DIR]" >&2; exit 2; }
out="$1"; shift
py="$("$repo/scripts/toolchain-venv.sh")"
tools="$(dirname "$("$repo/scripts/build-llama-perplexity.sh")")"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" HF_HUB_OFFLINE=1
exec "$py" -m harness.toolchain.build "$out" --llama-src "$tools/src" --quantize "$tools/llama-quantize" "$@"
