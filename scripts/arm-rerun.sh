#!/usr/bin/env bash
# Chosen gates (or the seed search) on llama.cpp's ARM code paths again, quickly: in the arm64 root file system
# scripts/arm-gates.sh built and keeps in its cache, without that script's setup.sh inside (~15 minutes emulated).
# This commit's files go to /opt/bmoe beside the venv an earlier arm-gates.sh run's setup.sh made there (so only while
# pyproject.toml's dependencies are unchanged since that run: else run arm-gates.sh), and the C helpers are compiled
# inside by the root file system's gcc (setup.py build_ext --inplace, without pyproject.toml). The same chroot, mounts
# and environment as arm-gates.sh's in_rootfs. For a record with the commit, results and findings: arm-gates.sh.
#
#   scripts/arm-rerun.sh sync               this commit's files into the root file system, C helpers built inside
#   scripts/arm-rerun.sh build              the C helpers again, inside
#   scripts/arm-rerun.sh update             only the files changed since the last sync (refused if C or the build did)
#   scripts/arm-rerun.sh seeds NAME SEED... python -m tests.helpers.arch_seeds NAME SEED... inside
#   scripts/arm-rerun.sh pytest ARGS...     python -m pytest ARGS... inside (basetemp /tmp/arm-targeted)
#   scripts/arm-rerun.sh sh 'COMMAND'       any command inside, in /opt/bmoe
# Root; nice 19 and the idle I/O class, as arm-gates.sh.
set -euo pipefail
case "${1:-}" in
  sync|build|update|seeds|pytest|sh) ;;
  *) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 2 ;;
esac
repo="$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
cache="${BMOE_ARM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bmoe/arm64}"
rootfs="$cache/rootfs"
die() { echo "arm-rerun.sh: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (chroot, mounts): run it as root"
[ -x "$rootfs/opt/bmoe/.venv/bin/python" ] || die "no venv in $rootfs/opt/bmoe: run scripts/arm-gates.sh once"
grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null \
  || die "binfmt_misc's qemu-aarch64 is not enabled: run scripts/arm-gates.sh once"
in_rootfs() {  # as scripts/arm-gates.sh's in_rootfs
  nice -n 19 ionice -c3 unshare --mount --propagation private -- /bin/sh -c '
    r=$1; shift
    mount -t proc proc "$r/proc" && mount -t sysfs sysfs "$r/sys" && mount --rbind /dev "$r/dev" || exit 1
    exec chroot "$r" /usr/bin/env -i HOME=/root LANG=C.UTF-8 PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin \
      QEMU_CPU="$1" PIP_DISABLE_PIP_VERSION_CHECK=1 /bin/bash -c "$2"' sh "$rootfs" "${BMOE_ARM_QEMU_CPU:-max}" "$1"
}
build() {  # the C helpers, by setup.py alone: the venv's setuptools (66 on bookworm) cannot read today's pyproject.toml
  in_rootfs 'rm -rf /tmp/cbuild && mkdir /tmp/cbuild && cd /tmp/cbuild && cp /opt/bmoe/setup.py . \
    && ln -s /opt/bmoe/harness harness && /opt/bmoe/.venv/bin/python setup.py -q build_ext --inplace 2>&1 | tail -n 5
    cd /opt/bmoe && ls harness/engine/native/*.so
    echo "uname -m: $(uname -m); kernel.arch: $(cat /proc/sys/kernel/arch 2>/dev/null)"'
}
cmd="${1:-}"; shift || true
case "$cmd" in
  sync)
    commit="$(git -C "$repo" rev-parse HEAD)"
    dst="$rootfs/opt/bmoe"
    find "$dst" -mindepth 1 -maxdepth 1 ! -name .venv -exec rm -rf {} +
    git -C "$repo" archive --format=tar "$commit" | tar -x -C "$dst"
    echo "$commit" >"$dst/.commit"
    build
    echo "arm-rerun.sh: /opt/bmoe is commit $commit" ;;
  update)
    dst="$rootfs/opt/bmoe"
    [ -f "$dst/.commit" ] || die "/opt/bmoe was not put there by a sync: scripts/arm-rerun.sh sync"
    old="$(cat "$dst/.commit")"; commit="$(git -C "$repo" rev-parse HEAD)"
    changed="$(git -C "$repo" diff --name-only "$old" "$commit")"
    if grep -qE '\.(c|h)$|^setup\.py$|^pyproject\.toml$' <<<"$changed"; then
      die "C sources or the build changed since $old: scripts/arm-rerun.sh sync"
    fi
    while read -r f; do
      [ -n "$f" ] || continue
      if git -C "$repo" cat-file -e "$commit:$f" 2>/dev/null; then
        mkdir -p "$dst/$(dirname "$f")" && git -C "$repo" show "$commit:$f" >"$dst/$f"
      else rm -f "$dst/$f"; fi
    done <<<"$changed"
    echo "$commit" >"$dst/.commit"
    echo "arm-rerun.sh: /opt/bmoe is commit $commit ($(wc -l <<<"$changed") files changed since $old)" ;;
  build) build ;;
  seeds) in_rootfs "cd /opt/bmoe && .venv/bin/python -m tests.helpers.arch_seeds $(printf '%q ' "$@")" ;;
  pytest) in_rootfs "cd /opt/bmoe && echo \"commit \$(cat .commit)\" && .venv/bin/python -m pytest -p no:cacheprovider \
    --basetemp=/tmp/arm-targeted $(printf '%q ' "$@")" ;;
  sh) [ $# -eq 1 ] || die "sh takes one command (quoted)"; in_rootfs "cd /opt/bmoe && $1" ;;
esac
