#!/usr/bin/env bash
# The test command: set-up if needed, lint, then the whole pytest suite in one run. As root the suite
# runs inside a private network namespace with a real adbd on loopback (tests/adbd/), so the adb tests
# run too; without root they are skipped (and say why).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check harness tests
if [ "$(id -u)" -eq 0 ] && command -v unshare >/dev/null; then
  exec tests/adbd/run-adb-tests.sh -q -rs "$@" tests
else
  echo "test: not root: running without the adbd namespace (adb tests will skip)" >&2
  exec .venv/bin/python -m pytest -q -rs "$@" tests
fi
