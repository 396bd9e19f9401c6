#!/usr/bin/env bash
# Build the C++ original's engine (`bmoe-cli`, the peer bmoe is measured against) with the shared recipe,
# when the shared tree sits next to this repository (../shared); the product itself never needs it.
#
#   scripts/build-peer.sh            -> prints the path of the built bmoe-cli (idempotent: reuses it)
#
# Output: $BMOE_PEER_DIR/bmoe-cli (default ~/.cache/bmoe/peer), where the tests and campaigns look for it.
# Recipe: $BMOE_PEER_RECIPE (default ../shared/tools/peer/build-bmoe-cli.sh). ~5 minutes on 2 cores the first
# time (it downloads the llama-cpp-python 0.3.36 sdist for its vendored llama.cpp); needs cmake and g++.
# Exit 0 with a message on stderr and nothing on stdout when the recipe is absent (nothing to build).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="${BMOE_PEER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bmoe/peer}"
recipe="${BMOE_PEER_RECIPE:-$repo/../shared/tools/peer/build-bmoe-cli.sh}"
if [ -x "$out/bmoe-cli" ]; then echo "$out/bmoe-cli"; exit 0; fi
if [ ! -f "$recipe" ]; then
  echo "build-peer: no recipe at $recipe (the shared tree is not next to this repository): peer not built" >&2
  exit 0
fi
for tool in cmake g++; do
  command -v "$tool" >/dev/null || { echo "build-peer: $tool is missing (apt-get install cmake ninja-build g++)" >&2; exit 1; }
done
py="${PYTHON:-$repo/.venv/bin/python}"
[ -x "$py" ] || py="$(command -v python3)"
mkdir -p "$out"
start=$(date +%s)
PYTHON="$py" bash "$recipe" "$out" >/dev/null
echo "build-peer: built $out/bmoe-cli in $(( $(date +%s) - start )) s" >&2
echo "$out/bmoe-cli"
