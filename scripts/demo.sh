#!/usr/bin/env bash
# The main job on a fresh machine: set-up, then the demo campaign (a generated model; the mmap baseline
# against streamed experts under a memory cap smaller than the model) on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/bmoe-bench run campaigns/demo.yaml "$@"
