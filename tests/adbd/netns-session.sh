#!/usr/bin/env bash
# usage: netns-session.sh CMD [ARGS...]     (run by run-adb-tests.sh inside `unshare --net --mount`)
#
# Inside a fresh, private network + mount namespace: brings loopback up, starts the real adbd
# ($BMOE_TEST_ADBD, from install-adbd.sh) on 127.0.0.1:$BMOE_TEST_ADBD_PORT, starts an adb server (the
# adbutils wheel's adb) and connects it, gives the "device" an Android-like /data/local/tmp (a tmpfs of
# $BMOE_TEST_DATA_MB MiB, private to this mount namespace), exports BMOE_ADB_TEST_SERIAL, runs CMD, and
# stops adbd and the adb server. It refuses to start adbd if any interface other than lo exists here,
# because adbd has no authentication and would listen on it.
set -euo pipefail

: "${BMOE_TEST_ADBD:?path of the adbd launcher (tests/adbd/install-adbd.sh prints it)}"
: "${BMOE_TEST_ADB:?path of the adb client/server binary}"
PORT="${BMOE_TEST_ADBD_PORT:-15555}"   # outside 5555-5585, the adb server's emulator scan range

others="$(ip -o link show | awk -F': ' '{sub(/@.*/, "", $2); print $2}' | grep -vx lo || true)"
if [ -n "$others" ]; then
    echo "netns-session: refusing to start adbd: this namespace has interfaces other than lo: $others" >&2
    exit 1
fi
ip link set lo up

# Android's writable place; /data is a tmpfs seen only inside this mount namespace. /data must exist as
# a mount point on the host: created empty if absent (the only trace left outside the namespace).
mkdir -p /data
mount -t tmpfs -o "size=${BMOE_TEST_DATA_MB:-512}m,mode=0755" bmoe-test-data /data
mkdir -p /data/local/tmp
chmod 1777 /data/local/tmp

log="${BMOE_TEST_ADBD_LOG:-${TMPDIR:-/tmp}/bmoe-test-adbd.$$.log}"
# the device side: cwd /, a small PATH, like an Android shell. With BMOE_TEST_DEVICE_PROFILE=DIR (a profile
# written by `python -m tests.helpers.device_profile DIR`) adbd runs in a mount namespace of its own with the
# profile laid over /sys and its dumpsys on PATH (device-profile.sh; /data stays this session's); without it,
# the device is this Linux as it is, which the tests of tests/bench/test_adb.py expect.
here="$(cd "$(dirname "$0")" && pwd)"
launch=("$BMOE_TEST_ADBD")
if [ -n "${BMOE_TEST_DEVICE_PROFILE:-}" ]; then
    launch=(unshare --mount --propagation private -- "$here/device-profile.sh" "$BMOE_TEST_DEVICE_PROFILE"
            "$BMOE_TEST_ADBD")
fi
(cd / && exec env -i ADBD_PORT="$PORT" PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/ BMOE_PROFILE_DATA_MB=0 \
    "${launch[@]}") >"$log" 2>&1 </dev/null &
adbd_pid=$!
cleanup() {
    "$BMOE_TEST_ADB" kill-server >/dev/null 2>&1 || true
    kill "$adbd_pid" 2>/dev/null || true
    wait "$adbd_pid" 2>/dev/null || true
}
trap cleanup EXIT

for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
    sleep 0.1
done
"$BMOE_TEST_ADB" start-server >/dev/null 2>&1
"$BMOE_TEST_ADB" connect "127.0.0.1:$PORT" >/dev/null
timeout 20 "$BMOE_TEST_ADB" -s "127.0.0.1:$PORT" wait-for-device || {
    echo "netns-session: adbd did not come up on 127.0.0.1:$PORT (log: $log)" >&2; exit 1; }

export BMOE_ADB_TEST_SERIAL="127.0.0.1:$PORT" BMOE_TEST_ADBD_LOG="$log"
unset ANDROID_SERIAL
"$@"
