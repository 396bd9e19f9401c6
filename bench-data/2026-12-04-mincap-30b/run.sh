#!/bin/sh
# The minimum memory cap of bmoe and of the C++ original (bmoe-cli, scripts/build-peer.sh) at the Qwen3-30B-A3B shape
# (17.3 GB generated: `bmoe-bench make-model`, campaigns/peer-cxx-30b.yaml's recipe), with the settings that campaign
# pins, at --cache-mb 0 and 2000 (its two cache cells). Resolution 16 MiB, one run per cap (the 1.1 GiB searches of
# bench-data/2026-12-03-mincap ran each cap twice at 8 MiB: at 17 GB a run takes ~20 s, and this fit one session).
# Run from the repository root as root (real cgroup caps). Appends to mincap.jsonl in this folder.
set -eu
HERE=$(dirname "$0")
PY=${PY:-.venv/bin/python}
MODEL=${MODEL:?the generated Qwen3-30B-A3B-shape model.gguf}
PEER=${PEER:-$HOME/.cache/bmoe/peer/bmoe-cli}
FLAGS="-p A -n 8 -t 1 -c 256 --moe-stream --force-cache --io-threads 4 --dense-weights anon"
SEARCH="--resolution 16 --repeats 1 --lo 512 --roomy 6144"
bench() { "$PY" -m harness.bench_cli "$@"; }
for cache in ${CACHES:-0 2000}; do
  bench mincap --label "bmoe-30b-$cache" --out "$HERE" $SEARCH -- \
    "$PY" -m harness.engine.cli -m "$MODEL" $FLAGS --cache-mb $cache --cache-policy lru --flash-attn auto
  bench mincap --label "cxx-30b-$cache" --out "$HERE" $SEARCH -- "$PEER" -m "$MODEL" $FLAGS --cache-mb $cache
done
