#!/usr/bin/env bash
# The main job on a fresh machine: set-up, then two campaigns on this machine: demo-text (the bundled trained model
# writes text, plain and streamed from flash: the same words, shown in its findings.md) and demo (a generated model;
# the mmap baseline against streamed experts under a memory cap smaller than the model).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/bmoe-bench run campaigns/demo-text.yaml "$@"
exec .venv/bin/bmoe-bench run campaigns/demo.yaml "$@"
