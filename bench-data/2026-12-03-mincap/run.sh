#!/bin/sh
# The minimum memory cap of bmoe and of the C++ original (bmoe-cli, scripts/build-peer.sh) on the 1.1 GiB generated
# qwen3moe of campaigns/peer-cxx.yaml, with the settings that campaign pins, at --cache-mb 0 and 160; then one run of
# each at its minimum cap with its memory broken down by kind.
# Run from the repository root as root (real cgroup caps). BEFORE=1 runs instead the bmoe command given by
# BMOE_BEFORE (the engine before the changes: here /work/main/.venv/bin/bmoe, main at 5d41c93). Appends to
# mincap.jsonl in this folder.
set -eu
HERE=$(dirname "$0")
PY=${PY:-.venv/bin/python}
MODEL=${MODEL:-$HOME/.cache/bmoe/models/bf2a7edec23d5e68/model.gguf}   # bmoe-bench make-model, peer-cxx's recipe
PEER=${PEER:-$HOME/.cache/bmoe/peer/bmoe-cli}
PROMPT="Explain how a mixture-of-experts model decides which experts handle each token."
FLAGS="-n 12 -t 1 -c 512 --moe-stream --force-cache --io-threads 4 --dense-weights anon"
SEARCH="--resolution 8 --repeats 2 --lo 128"
bench() { nice -n 19 ionice -c3 "$PY" -m harness.bench_cli "$@"; }
for cache in 0 160; do
  if [ "${BEFORE:-0}" = 1 ]; then
    bench mincap --label "bmoe-before-$cache" --out "$HERE" $SEARCH --breakdown -- \
      "${BMOE_BEFORE:?}" -m "$MODEL" -p "$PROMPT" $FLAGS --cache-mb $cache \
      --cache-policy lru --flash-attn auto
  else
    bench mincap --label "bmoe-$cache" --out "$HERE" $SEARCH --breakdown -- \
      "$PY" -m harness.engine.cli -m "$MODEL" -p "$PROMPT" $FLAGS --cache-mb $cache --cache-policy lru \
      --flash-attn auto
    [ "${SKIP_PEER:-0}" = 1 ] || bench mincap --label "cxx-$cache" --out "$HERE" $SEARCH --breakdown -- \
      "$PEER" -m "$MODEL" -p "$PROMPT" $FLAGS --cache-mb $cache
  fi
done
