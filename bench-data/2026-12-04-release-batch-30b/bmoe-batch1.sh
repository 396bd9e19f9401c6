#!/bin/sh
# bmoe with the page releaser's batch at one layer (harness/engine/io/release.py batch_layers -> 1), this checkout's code
cd /work/wt-exp && exec /work/main/.venv/bin/python -m harness.engine.cli "$@"
