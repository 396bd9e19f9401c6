#!/usr/bin/env bash
# What the reference's top K lose (bmoe --fidelity-top-k): the same lossy run (--n-expert-used N) scored against
# references of the same text that keep the top K tokens of each position, K = 0 (the whole vocabulary: the exact
# KLD) and the given Ks; prints each reference's size and the run's fidelity line, and the share of the probability
# the top K hold.
#
#   scripts/fidelity_topk_loss.sh MODEL.gguf TEXT_FILE CTX CHUNKS N_EXPERT_USED K...
#   e.g. scripts/fidelity_topk_loss.sh m.gguf text.txt 128 2 1 64 256
set -euo pipefail
model=$1 text=$2 ctx=$3 chunks=$4 k_used=$5
shift 5
repo="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-$repo/.venv/bin/python}"
w="$(mktemp -d)"; trap 'rm -rf "$w"' EXIT
bmoe() { (cd "$repo" && nice -n 19 ionice -c3 "$py" -m harness.engine.cli -m "$model" -t 2 "$@"); }
for k in 0 "$@"; do
  bmoe -p "$(cat "$text")" -c "$ctx" --fidelity-chunks "$chunks" --fidelity-top-k "$k" --fidelity-ref "$w/k$k.ref" \
    2>/dev/null
  echo "top-k $k: reference $(stat -c %s "$w/k$k.ref") bytes"
  bmoe --fidelity-against "$w/k$k.ref" --n-expert-used "$k_used" 2>&1 | grep '^fidelity:\|keeps each' | sed 's/^/  /'
done
