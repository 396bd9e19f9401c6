#!/usr/bin/env bash
# The toolchain venv: torch, transformers and the pinned llama.cpp converter's needs (scripts/toolchain-requirements.txt),
# for the trained-model recipe (scripts/train-model.sh) and the real-toolchain gates. Kept apart from .venv so the
# product's install and CI stay light. Idempotent; prints the venv's python.
#   BMOE_TOOLCHAIN_VENV   where (default ~/.cache/bmoe/toolchain-venv)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="${BMOE_TOOLCHAIN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/bmoe/toolchain-venv}"
req="$repo/scripts/toolchain-requirements.txt"
if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv" >&2
fi
if [ ! -f "$venv/.installed" ] || [ "$req" -nt "$venv/.installed" ]; then
  echo "toolchain-venv: installing $req into $venv (torch's CPU wheel: ~1 GB)" >&2
  "$venv/bin/python" -m pip install -q -r "$req" >&2
  touch "$venv/.installed"
fi
echo "$venv/bin/python"
