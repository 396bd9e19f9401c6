#!/usr/bin/env bash
# Run a command in the loopback lab of fleet-lab.sh (two adb servers, four adbd devices), in a private network
# namespace, as run-adb-tests.sh runs the tests. Needs root.
#
#   tests/adbd/run-in-fleet-lab.sh bmoe-bench devices --server 127.0.0.1:5041 --server 127.0.0.1:5042
#   tests/adbd/run-in-fleet-lab.sh scripts/fleet-loopback.sh      # the committed loopback fleet campaign
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
py="${PYTHON:-$repo/.venv/bin/python}"
[ -x "$py" ] || py="$(command -v python3)"
if [ "$(id -u)" -ne 0 ]; then
    echo "run-in-fleet-lab: needs root (unshare --net --mount)" >&2
    exit 1
fi
[ "$#" -gt 0 ] || { echo "usage: run-in-fleet-lab.sh CMD [ARGS...]" >&2; exit 2; }
BMOE_TEST_ADBD="$("$here/install-adbd.sh")"
BMOE_TEST_ADB="${BMOE_TEST_ADB:-$("$py" -c 'import adbutils; print(adbutils.adb_path())')}"
export BMOE_TEST_ADBD BMOE_TEST_ADB
cd "$repo"
exec unshare --net --mount --propagation private -- "$here/netns-session.sh" "$here/fleet-lab.sh" "$@"
