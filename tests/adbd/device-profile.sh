#!/usr/bin/env bash
# usage: device-profile.sh PROFILE CMD [ARGS...]
#
# Lays a device profile (a tree written by tests/helpers/device_profile.py) over this mount namespace, then
# execs CMD (an adbd) with the profile's bin on PATH. Run it only inside a private mount namespace of its
# own (`unshare --mount --propagation private -- device-profile.sh ...`): it bind-mounts
#   PROFILE/sys/class/thermal                 over /sys/class/thermal
#   PROFILE/sys/devices/system/cpu/cpufreq    over /sys/devices/system/cpu/cpufreq
# so the device's shell reads the profile's thermal zones and cpufreq policies at the real paths, and
# puts PROFILE/system/bin (dumpsys, svc, settings, cmd, input) first on PATH. Mounts made here are private to the
# namespace: the host's /sys, and the test's own namespace, never see them. The files are shared (same
# inodes), so a test writes PROFILE/... from outside and the device sees it at once, and reads back what
# the device's shell wrote. It also gives the device its own tmpfs /data/local/tmp of
# $BMOE_PROFILE_DATA_MB MiB (default 64), as the fleet devices have, unless BMOE_PROFILE_DATA_MB=0.
# BMOE_PROFILE_UNROOTED=1 plays an unrooted phone's cpufreq: the cpufreq tree is bind-mounted read-only in the
# device's namespace, so a governor written from the device's shell fails (EROFS) as a shell user's would (EACCES);
# the test still changes the files from outside (the mount is the device's alone).
set -euo pipefail
[ "$#" -ge 2 ] || { echo "usage: device-profile.sh PROFILE CMD [ARGS...]" >&2; exit 2; }
profile="$(cd "$1" && pwd)"; shift
self_ns="$(readlink /proc/self/ns/mnt)"
init_ns="$(readlink /proc/1/ns/mnt 2>/dev/null || true)"
if [ "$self_ns" = "$init_ns" ]; then
    echo "device-profile: refusing to mount over /sys in the host's mount namespace (run it under unshare --mount)" >&2
    exit 1
fi
lay() {  # lay SOURCE TARGET: bind SOURCE over TARGET, which must exist (sysfs takes no mkdir)
    [ -d "$profile/$1" ] || { echo "device-profile: $profile/$1 missing: not a profile?" >&2; exit 1; }
    [ -d "$2" ] || { echo "device-profile: cannot lay the profile over $2: no such directory here" >&2; exit 1; }
    mount --bind "$profile/$1" "$2"
}
lay sys/class/thermal /sys/class/thermal
lay sys/devices/system/cpu/cpufreq /sys/devices/system/cpu/cpufreq
if [ "${BMOE_PROFILE_UNROOTED:-0}" = 1 ]; then
    mount -o remount,bind,ro /sys/devices/system/cpu/cpufreq
fi
mb="${BMOE_PROFILE_DATA_MB:-64}"
if [ "$mb" != 0 ]; then
    mkdir -p /data
    mount -t tmpfs -o "size=${mb}m,mode=0755" bmoe-profile-data /data
    mkdir -p /data/local/tmp
    chmod 1777 /data/local/tmp
fi
export PATH="$profile/system/bin:${PATH:-/usr/sbin:/usr/bin:/sbin:/bin}"
exec "$@"
