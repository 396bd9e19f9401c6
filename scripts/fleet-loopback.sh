#!/usr/bin/env bash
# The loopback fleet campaign (campaigns/fleet-loopback.yaml), run inside the lab of tests/adbd/fleet-lab.sh:
#   sudo tests/adbd/run-in-fleet-lab.sh scripts/fleet-loopback.sh [--campaign FILE] [--out DIR] [more run options]
# --campaign: another campaign over the same lab (default campaigns/fleet-loopback.yaml; e.g.
# campaigns/fleet-loopback-replicate.yaml).
# Generates the model (shape small, 137 MB), writes the engine wrapper (this checkout's Python engine, run by
# the "device", which shares this machine's filesystem but /data) and runs the campaign with both --set.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-$repo/.venv/bin/python}"
work="${BMOE_FLEET_WORK:-${TMPDIR:-/tmp}/bmoe-fleet-loopback}"
campaign=campaigns/fleet-loopback.yaml
if [ "${1:-}" = "--campaign" ]; then
    [ "$#" -ge 2 ] || { echo "fleet-loopback.sh: --campaign needs a campaign file" >&2; exit 2; }
    campaign="$2"
    shift 2
fi
mkdir -p "$work"
[ -f "$work/small.gguf" ] || "$py" -m harness.bench_cli make-model "$work/small.gguf" --shape small
printf '#!/bin/sh\nPYTHONPATH=%q exec %q -m harness.engine.cli "$@"\n' "$repo" "$py" > "$work/bmoe-py"
chmod +x "$work/bmoe-py"
cd "$repo"
exec "$py" -m harness.bench_cli run "$campaign" \
    --set "model.push_from=$work/small.gguf" --set "engine.push_from=$work/bmoe-py" "$@"
