#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: a venv in .venv with every dependency from pyproject.toml.
# llama-cpp-python (pinned) is built from source with a trimmed build (no tools/examples/tests/server),
# ~8-10 minutes on 2 cores the first time; pip caches the wheel after that.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
  echo "setup: Python 3.11 or newer is needed (found: $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  "$PY" -m venv .venv
fi
# GGML_LLAMAFILE=OFF: llamafile's tinyBLAS takes every matmul of 2+ columns and sums each dot product in another
# order than ggml_vec_dot, which takes the 1-column matmul of a single-token decode; without it a verify batch
# (--ngram, --mtp) gives the logits one-token decoding gives, bit for bit (tests/gates/test_batch_exact.py)
export CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_LLAMAFILE=OFF}"
# the build tools pyproject.toml's [build-system] names go into the venv too: `bmoe-bench deploy` copies the harness's
# own setuptools and wheel to a target and builds bmoe there without isolation (a venv's bundled setuptools 65 cannot
# read pyproject.toml's license string)
tools_ok() { .venv/bin/python -m harness.deploy.build_tools >/dev/null 2>&1; }
if ! .venv/bin/python -c 'import llama_cpp, harness' 2>/dev/null || [ pyproject.toml -nt .venv/.bmoe-installed ] || ! tools_ok; then
  echo "setup: installing dependencies (the first llama-cpp-python build takes ~10 minutes)" >&2
  # shellcheck disable=SC2046  # one argument per requirement (no spaces inside one)
  .venv/bin/python -m pip install -q --upgrade pip $(.venv/bin/python -m harness.deploy.build_tools)
  .venv/bin/python -m pip install -q -e '.[dev]'
  touch .venv/.bmoe-installed
fi
if .venv/bin/python -c 'import llama_cpp, sys; sys.exit("LLAMAFILE = 1" not in llama_cpp.llama_print_system_info().decode())' 2>/dev/null \
    && [[ "$CMAKE_ARGS" == *GGML_LLAMAFILE=OFF* ]]; then
  # pip's wheel cache does not key on CMAKE_ARGS: a wheel built before the flag would be reused
  echo "setup: rebuilding llama-cpp-python without llamafile's sgemm (~10 minutes)" >&2
  .venv/bin/python -m pip install -q --force-reinstall --no-deps --no-cache-dir --no-binary llama-cpp-python \
    "llama-cpp-python==$(.venv/bin/python -c 'import llama_cpp; print(llama_cpp.__version__)')"
fi
echo "setup: ready ($(.venv/bin/bmoe --version))" >&2
