#!/usr/bin/env bash
# usage: fleet-lab.sh CMD [ARGS...]     (inside netns-session.sh's private namespace: see run-in-fleet-lab.sh)
#
# A lab on loopback: two adb servers (`adb -a -P PORT server nodaemon`, ports 5041 and 5042) and four real
# adbd devices (127.0.0.1:15571-15574), each in its own mount namespace with its own tmpfs /data of
# $BMOE_FLEET_DATA_MB MiB (default 256), so the devices share no storage. 15571-15572 are attached to the
# server at 5041, 15573-15574 to the one at 5042. Runs CMD with BMOE_FLEET_SERVERS="127.0.0.1:5041
# 127.0.0.1:5042", then stops the devices and servers. With BMOE_FLEET_PROFILES=DIR, a device whose port has a
# profile in DIR/PORT (`python -m tests.helpers.device_profile DIR/15571 phone`) runs with it laid over it
# (device-profile.sh: its thermal zones, cpufreq policies and dumpsys). tests/helpers/adb_fleet.py builds the
# same lab for the tests, which kill and restart its parts.
set -euo pipefail
: "${BMOE_TEST_ADBD:?}" "${BMOE_TEST_ADB:?}"
here="$(cd "$(dirname "$0")" && pwd)"
mb="${BMOE_FLEET_DATA_MB:-256}"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
wait_port() {
    for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done
    echo "fleet-lab: nothing listens on 127.0.0.1:$1" >&2; return 1
}
for s in 5041 5042; do
    "$BMOE_TEST_ADB" -a -P "$s" server nodaemon >/dev/null 2>&1 </dev/null &
    pids+=($!)
    wait_port "$s"
done
dev=(15571:5041 15572:5041 15573:5042 15574:5042)
for d in "${dev[@]}"; do
    port="${d%%:*}"; server="${d##*:}"
    if [ -n "${BMOE_FLEET_PROFILES:-}" ] && [ -d "$BMOE_FLEET_PROFILES/$port" ]; then
        (cd / && exec env -i ADBD_PORT="$port" PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/ BMOE_PROFILE_DATA_MB="$mb" \
            unshare --mount --propagation private -- "$here/device-profile.sh" "$BMOE_FLEET_PROFILES/$port" \
            "$BMOE_TEST_ADBD") >/dev/null 2>&1 </dev/null &
    else
        (cd / && exec env -i ADBD_PORT="$port" PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/ \
            unshare --mount --propagation private -- sh -c \
            "mount -t tmpfs -o size=${mb}m,mode=0755 bmoe-fleet-data /data && mkdir -p /data/local/tmp && \
             chmod 1777 /data/local/tmp && exec \"\$0\"" "$BMOE_TEST_ADBD") >/dev/null 2>&1 </dev/null &
    fi
    pids+=($!)
    wait_port "$port"
    "$BMOE_TEST_ADB" -P "$server" connect "127.0.0.1:$port" >/dev/null
    timeout 20 "$BMOE_TEST_ADB" -P "$server" -s "127.0.0.1:$port" wait-for-device
done
export BMOE_FLEET_SERVERS="127.0.0.1:5041 127.0.0.1:5042"
"$@"
