#!/usr/bin/env bash
# Run the adb tests against a real adbd on loopback, in a private network namespace.
#
#   tests/adbd/run-adb-tests.sh [PYTEST ARGS...]      (default args: -m adb tests)
#
# Installs adbd if needed (install-adbd.sh), then runs pytest inside `unshare --net --mount` where
# netns-session.sh has started adbd on 127.0.0.1:15555 and an adb server connected to it. Needs root
# (unshare, mount). Outside this wrapper the adb tests skip. Env: PYTHON (default: the repo's .venv
# python), BMOE_TEST_ADBD_PREFIX (where adbd is installed), BMOE_TEST_ADBD_PORT (default 15555).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
py="${PYTHON:-$repo/.venv/bin/python}"
[ -x "$py" ] || py="$(command -v python3)"

if [ "$(id -u)" -ne 0 ]; then
    echo "run-adb-tests: needs root (unshare --net --mount)" >&2
    exit 1
fi
BMOE_TEST_ADBD="$("$here/install-adbd.sh")"
BMOE_TEST_ADB="${BMOE_TEST_ADB:-$("$py" -c 'import adbutils; print(adbutils.adb_path())')}"
export BMOE_TEST_ADBD BMOE_TEST_ADB

[ "$#" -gt 0 ] || set -- -m adb tests
cd "$repo"
exec unshare --net --mount --propagation private -- "$here/netns-session.sh" "$py" -m pytest "$@"
