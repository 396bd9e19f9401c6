#!/usr/bin/env bash
# The targeted ARM runs of this folder (issue 27 item 4: granitemoe's seed, the management clocks), in the arm64 root
# file system scripts/arm-gates.sh built and keeps in its cache, without that script's setup.sh inside (~15 minutes
# emulated): this commit's files go to /opt/bmoe beside the venv setup.sh made there for commit 78b817a (the
# dependencies in pyproject.toml have not changed since), and the C helpers are compiled inside by the root file
# system's gcc (setup.py build_ext --inplace). The same chroot, mounts and environment as arm-gates.sh's in_rootfs.
#
#   run.sh sync                     this commit's files into the root file system, C helpers built inside
#   run.sh update                   only the files changed since the last sync (refused if C sources changed)
#   run.sh seeds NAME SEED...       python -m tests.helpers.arch_seeds NAME SEED... inside
#   run.sh pytest ARGS...           python -m pytest ARGS... inside (basetemp /tmp/arm-targeted)
#   run.sh sh 'COMMAND'             any command inside, in /opt/bmoe
# Root; nice 19 and the idle I/O class, as arm-gates.sh.
set -euo pipefail
repo="$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
cache="${BMOE_ARM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bmoe/arm64}"
rootfs="$cache/rootfs"
[ -x "$rootfs/opt/bmoe/.venv/bin/python" ] || { echo "run.sh: no venv in $rootfs/opt/bmoe: run scripts/arm-gates.sh once" >&2; exit 1; }
grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 || { echo "run.sh: binfmt_misc's qemu-aarch64 is not enabled: run scripts/arm-gates.sh once" >&2; exit 1; }
in_rootfs() {  # as scripts/arm-gates.sh's in_rootfs
  nice -n 19 ionice -c3 unshare --mount --propagation private -- /bin/sh -c '
    r=$1; shift
    mount -t proc proc "$r/proc" && mount -t sysfs sysfs "$r/sys" && mount --rbind /dev "$r/dev" || exit 1
    exec chroot "$r" /usr/bin/env -i HOME=/root LANG=C.UTF-8 PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin \
      QEMU_CPU="$1" PIP_DISABLE_PIP_VERSION_CHECK=1 /bin/bash -c "$2"' sh "$rootfs" "${BMOE_ARM_QEMU_CPU:-max}" "$1"
}
cmd="${1:-}"; shift || true
case "$cmd" in
  sync)
    commit="$(git -C "$repo" rev-parse HEAD)"
    dst="$rootfs/opt/bmoe"
    find "$dst" -mindepth 1 -maxdepth 1 ! -name .venv -exec rm -rf {} +
    git -C "$repo" archive --format=tar "$commit" | tar -x -C "$dst"
    echo "$commit" >"$dst/.commit"
    in_rootfs 'cd /opt/bmoe && .venv/bin/python setup.py build_ext --inplace -q 2>&1 | tail -n 5; ls harness/engine/native/*.so
      echo "uname -m: $(uname -m); kernel.arch: $(cat /proc/sys/kernel/arch 2>/dev/null)"'
    echo "run.sh: /opt/bmoe is commit $commit" ;;
  update)
    dst="$rootfs/opt/bmoe"; old="$(cat "$dst/.commit")"; commit="$(git -C "$repo" rev-parse HEAD)"
    changed="$(git -C "$repo" diff --name-only "$old" "$commit")"
    if grep -qE '\.(c|h)$|^setup\.py$|^pyproject\.toml$' <<<"$changed"; then
      echo "run.sh: C sources or the build changed since $old: run.sh sync" >&2; exit 1
    fi
    while read -r f; do
      [ -n "$f" ] || continue
      if git -C "$repo" cat-file -e "$commit:$f" 2>/dev/null; then
        mkdir -p "$dst/$(dirname "$f")" && git -C "$repo" show "$commit:$f" >"$dst/$f"
      else rm -f "$dst/$f"; fi
    done <<<"$changed"
    echo "$commit" >"$dst/.commit"
    echo "run.sh: /opt/bmoe is commit $commit ($(wc -l <<<"$changed") files changed since $old)" ;;
  seeds) in_rootfs "cd /opt/bmoe && .venv/bin/python -m tests.helpers.arch_seeds $(printf '%q ' "$@")" ;;
  pytest) in_rootfs "cd /opt/bmoe && echo \"commit \$(cat .commit)\" && .venv/bin/python -m pytest -p no:cacheprovider \
    --basetemp=/tmp/arm-targeted $(printf '%q ' "$@")" ;;
  sh) in_rootfs "cd /opt/bmoe && $1" ;;
  *) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 2 ;;
esac
