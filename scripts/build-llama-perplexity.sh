#!/usr/bin/env bash
# Build llama.cpp's own `llama-perplexity` and `llama-quantize` from the llama.cpp that the pinned llama-cpp-python
# vendors (the one bmoe runs on), and keep its converter (`convert_hf_to_gguf.py`, `conversion/`, `gguf-py/`, its
# LICENSE) beside them: llama-perplexity checks bmoe's fidelity figures against the field's tool
# (tests/gates/test_fidelity_llamacpp.py); the converter and llama-quantize make GGUF files the way users' models are
# made (scripts/train-model.sh, the real-toolchain gates). The product never needs them; they live outside its install.
#
#   scripts/build-llama-perplexity.sh      -> prints the path of the built llama-perplexity (idempotent: reuses it)
#
# Output: $BMOE_PERPLEXITY_DIR/{llama-perplexity,llama-quantize,src/} (default ~/.cache/bmoe/llama-perplexity), where
# the tests and the recipe look.
# It downloads the llama-cpp-python sdist of the version pyproject.toml pins (pip download) and builds only the
# llama-perplexity target, statically, with bmoe's llama.cpp flags (scripts/setup.sh: -DGGML_LLAMAFILE=OFF) so both
# compute the same logits, with one line added to llama-perplexity (below: its log flushed at exit). Needs cmake and
# g++. Runs at nice 19 (the machine may be shared with benchmarks).
# $out/build-flags records the version and flags; a binary built otherwise is rebuilt.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="${BMOE_PERPLEXITY_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bmoe/llama-perplexity}"
version="$(sed -n 's/^ *"llama-cpp-python==\([^"]*\)".*/\1/p' "$repo/pyproject.toml" | head -n1)"
[ -n "$version" ] || { echo "build-llama-perplexity: no exact llama-cpp-python pin in $repo/pyproject.toml" >&2; exit 1; }
flags="llama-cpp-python==$version -DGGML_LLAMAFILE=OFF -DBUILD_SHARED_LIBS=OFF targets=llama-perplexity,llama-quantize,src patch=log-flush-at-exit"
if [ -x "$out/llama-perplexity" ] && [ -x "$out/llama-quantize" ] && [ "$(cat "$out/build-flags" 2>/dev/null)" = "$flags" ]; then
  echo "$out/llama-perplexity"; exit 0
fi
for tool in cmake g++; do
  command -v "$tool" >/dev/null || { echo "build-llama-perplexity: $tool is missing (apt-get install cmake ninja-build g++)" >&2; exit 1; }
done
py="${PYTHON:-$repo/.venv/bin/python}"
[ -x "$py" ] || py="$(command -v python3)"
mkdir -p "$out"
rm -rf "$out/llama-perplexity" "$out/llama-quantize" "$out/src" "$out/build-flags"
w="$(mktemp -d)"; trap 'rm -rf "$w"' EXIT
start=$(date +%s)
"$py" -m pip download -q "llama-cpp-python==$version" --no-deps --no-binary :all: -d "$w/sdist" >&2
tar -xzf "$w/sdist/llama_cpp_python-$version.tar.gz" -C "$w"
src="$w/llama_cpp_python-$version/vendor/llama.cpp"
# One line added to llama-perplexity's main, nothing else: llama.cpp's log (common/log.cpp) prints through a worker
# thread, and its singleton is never deleted, so nothing joins that thread at exit and the lines still queued are lost.
# On a busy machine that is the end of the output, the KL-divergence summary with it (5 runs of 5 lost it beside three
# test suites and two CPU burners, 2026-12-05). common_log_pause() before main returns lets the worker write them all.
pp="$src/tools/perplexity/perplexity.cpp"
"$py" - "$pp" <<'PATCH'
import sys
p = sys.argv[1]
s = open(p).read()
old = "    llama_backend_free();\n\n    return 0;\n}\n"
if s.count(old) != 1:
    sys.exit(f"build-llama-perplexity: {p} does not end as expected: the log-flush patch does not apply")
open(p, "w").write(s.replace(old, "    llama_backend_free();\n\n    common_log_pause(common_log_main());\n\n    return 0;\n}\n"))
PATCH
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
nice -n 19 cmake -S "$src" -B "$w/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DGGML_LLAMAFILE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_CURL=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF >&2
nice -n 19 cmake --build "$w/build" --target llama-perplexity llama-quantize -j "$(nproc)" >&2
cp "$w/build/bin/llama-perplexity" "$w/build/bin/llama-quantize" "$out/"
mkdir -p "$out/src"
cp -r "$src/convert_hf_to_gguf.py" "$src/conversion" "$src/gguf-py" "$src/LICENSE" "$out/src/"
echo "$flags" >"$out/build-flags"
echo "build-llama-perplexity: built llama-perplexity, llama-quantize and kept the converter in $out in $(( $(date +%s) - start )) s" >&2
echo "$out/llama-perplexity"
