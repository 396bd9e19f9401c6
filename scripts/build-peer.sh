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
# The peer's llama.cpp is built as bmoe's is (scripts/setup.sh): without llamafile's sgemm (-DGGML_LLAMAFILE=OFF),
# whose batched matmuls round differently from ggml's own, so the two engines' prefills give the same bytes. The
# recipe is run from a copy with that flag added to its cmake line; $out/build-flags records it, and a binary
# built without it (an older build) is rebuilt.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="${BMOE_PEER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bmoe/peer}"
recipe="${BMOE_PEER_RECIPE:-$repo/../shared/tools/peer/build-bmoe-cli.sh}"
flags="-DGGML_LLAMAFILE=OFF"
if [ -x "$out/bmoe-cli" ] && [ "$(cat "$out/build-flags" 2>/dev/null)" = "$flags" ]; then echo "$out/bmoe-cli"; exit 0; fi
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
rm -f "$out/bmoe-cli" "$out/build-flags"
copy="$(mktemp)"; trap 'rm -f "$copy"' EXIT
sed -e "s|^HERE=.*|HERE=$(cd "$(dirname "$recipe")" && pwd)|" -e "s|-DBUILD_SHARED_LIBS=OFF|-DBUILD_SHARED_LIBS=OFF $flags|" \
  "$recipe" >"$copy"
grep -q -- "$flags" "$copy" || { echo "build-peer: $recipe has no '-DBUILD_SHARED_LIBS=OFF' cmake line to add $flags to" >&2; exit 1; }
start=$(date +%s)
PYTHON="$py" bash "$copy" "$out" >/dev/null
echo "$flags" >"$out/build-flags"
echo "build-peer: built $out/bmoe-cli in $(( $(date +%s) - start )) s" >&2
echo "$out/bmoe-cli"
