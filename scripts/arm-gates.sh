#!/usr/bin/env bash
# bmoe's byte-identity gates on llama.cpp's ARM code paths, under emulation. An arm64 Debian root file system
# (debootstrap) runs through qemu-user-static and binfmt_misc; in it the project is installed from its own files
# (this commit's `git archive`, then its scripts/setup.sh) with the pinned llama-cpp-python built for arm64 without
# llamafile, and one pytest invocation runs the gates tests/helpers/arm_gates.py lists for every covered
# architecture: streamed == resident with the cache off, with evictions on 2 reader lanes, prefetch, and the
# wrong-expert negative controls. Slow (see the findings of the last run): run by a person or a scheduled job.
#
#   scripts/arm-gates.sh [--smoke] [--out DIR]
#
#   --smoke     the short subset (one architecture: tests/helpers/arm_gates.py's SMOKE) instead of every gate
#   --out DIR   where the results go (default bench-data/<UTC date>-arm-gates, -arm-gates-smoke with --smoke):
#               arm-gates.log, junit.xml, results.md, system-info.txt, findings.md (with the commit they ran at)
#
# Idempotent: the root file system and the wheel stay in $BMOE_ARM_CACHE (default ~/.cache/bmoe/arm64) and are
# reused while their stamps match (Debian suite and packages; llama-cpp-python's version and build flags). The
# wheel is cross-compiled on the host by Debian's g++-aarch64-linux-gnu, at native speed, with setup.sh's flags;
# pip, the C helpers and the tests run inside the root file system, emulated.
# Needs root (debootstrap, chroot, mounts, binfmt_misc) and apt for what it installs on the host: debootstrap,
# qemu-user-static, g++-aarch64-linux-gnu, cmake, ninja-build. Runs at nice 19 and the idle I/O class.
# Env: BMOE_ARM_CACHE; BMOE_ARM_SUITE (default bookworm: Python 3.11); BMOE_ARM_MARCH (-march of ggml's CPU code,
# default armv8.2-a+dotprod+fp16: the cores of phones since 2018); BMOE_ARM_QEMU_CPU (default max);
# PYTHON (a host python with pip, for the wheel build; default the repo's .venv, else python3).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"

die() { echo "arm-gates: $*" >&2; exit 1; }
smoke=0
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) smoke=1 ;;
    --out) [ $# -ge 2 ] || { echo "arm-gates: --out needs a folder; see --help" >&2; exit 2; }; out="$2"; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "arm-gates: unknown option $1; see --help" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot, mounts, binfmt_misc): run it as root"

cache="${BMOE_ARM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bmoe/arm64}"
suite="${BMOE_ARM_SUITE:-bookworm}"
march="${BMOE_ARM_MARCH:-armv8.2-a+dotprod+fp16}"
qemu_cpu="${BMOE_ARM_QEMU_CPU:-max}"
py="${PYTHON:-$repo/.venv/bin/python}"
[ -x "$py" ] || py="$(command -v python3)"
sfx=""; [ "$smoke" -eq 0 ] || sfx="-smoke"
out="${out:-$repo/bench-data/$(date -u +%F)-arm-gates$sfx}"
commit="$(git -C "$repo" rev-parse HEAD)"
mkdir -p "$out" "$cache"
out="$(cd "$out" && pwd)"
rm -f "$out"/{arm-gates.log,junit.xml,results.md,system-info.txt,findings.md,timings.txt}
exec > >(tee "$out/arm-gates.log") 2>&1
echo "arm-gates: commit $commit, results in $out, cache $cache"
low() { nice -n 19 ionice -c3 "$@"; }
since() { echo $(( $(date +%s) - $1 )); }
timing() { echo "$1 $2" >>"$out/timings.txt"; echo "arm-gates: $1: $2"; }
timing_get() { sed -n "s/^$1 //p" "$out/timings.txt" | tail -n1; }
start=$(date +%s)

# ---- the host's tools -----------------------------------------------------------------------------------------
need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
[ -x /usr/bin/qemu-aarch64-static ] || need+=(qemu-user-static)
command -v aarch64-linux-gnu-g++ >/dev/null || need+=(g++-aarch64-linux-gnu)
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v unshare >/dev/null || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || die "missing ${need[*]} and no apt-get: install them (Debian's names) and run again"
  echo "arm-gates: installing ${need[*]}"
  t=$(date +%s)
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  timing host-packages-seconds "$(since "$t")"
fi

# ---- binfmt_misc: the kernel hands arm64 programs to qemu-aarch64-static ----------------------------------------
bf=/proc/sys/fs/binfmt_misc
if [ ! -e "$bf/register" ]; then
  mount -t binfmt_misc binfmt_misc "$bf" 2>/dev/null \
    || die "cannot mount binfmt_misc on $bf (arm64 programs run through it): a VM or a privileged container is needed"
fi
if [ ! -e "$bf/qemu-aarch64" ]; then
  conf=/usr/lib/binfmt.d/qemu-aarch64.conf
  [ -f "$conf" ] || die "$conf is missing: reinstall qemu-user-static (apt-get install --reinstall qemu-user-static)"
  grep -v '^#' "$conf" | grep -m1 ':qemu-aarch64:' >"$bf/register"
fi
grep -qx enabled "$bf/qemu-aarch64" || die "binfmt_misc's qemu-aarch64 entry is disabled: echo 1 > $bf/qemu-aarch64"
interp="$(sed -n 's/^interpreter //p' "$bf/qemu-aarch64")"
binfmt_flags="$(sed -n 's/^flags: *//p' "$bf/qemu-aarch64")"

# ---- the arm64 root file system -------------------------------------------------------------------------------
rootfs="$cache/rootfs"
pkgs="python3,python3-venv,python3-dev,gcc,libc6-dev,ca-certificates"
rstamp="debootstrap --arch=arm64 --variant=minbase --include=$pkgs $suite"
ensure_rootfs() {
  if [ "$(cat "$cache/rootfs.stamp" 2>/dev/null)" = "$rstamp" ] && [ -x "$rootfs/usr/bin/python3" ]; then
    timing rootfs-seconds "$(cat "$cache/rootfs.seconds") s, reused from an earlier run"
    return
  fi
  echo "arm-gates: creating the arm64 root file system ($rstamp)"
  rm -rf "$rootfs" "$cache/rootfs.stamp" "$cache/rootfs.seconds"
  t=$(date +%s)
  if ! low debootstrap --arch=arm64 --variant=minbase --include="$pkgs" "$suite" "$rootfs" >"$cache/debootstrap.log" 2>&1; then
    tail -n 20 "$cache/debootstrap.log"
    die "debootstrap failed (its log: $cache/debootstrap.log)"
  fi
  since "$t" >"$cache/rootfs.seconds"
  echo "$rstamp" >"$cache/rootfs.stamp"
  timing rootfs-seconds "$(cat "$cache/rootfs.seconds") s, built by this run"
}

# ---- llama-cpp-python for arm64, cross-compiled with setup.sh's flags -----------------------------------------
version="$(sed -n 's/^ *"llama-cpp-python==\([^"]*\)".*/\1/p' "$repo/pyproject.toml" | head -n1)"
[ -n "$version" ] || die "no exact llama-cpp-python pin in $repo/pyproject.toml"
base="$(sed -n 's/^export CMAKE_ARGS="\${CMAKE_ARGS:-\(.*\)}"$/\1/p' "$repo/scripts/setup.sh")"
[[ "$base" == *GGML_LLAMAFILE=OFF* ]] || die "could not read setup.sh's CMAKE_ARGS (with -DGGML_LLAMAFILE=OFF)"
cross="-DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc"
cross+=" -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++ -DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=$march"
cross+=" -DLLAMA_CURL=OFF"  # model downloads only: never link the host's x86-64 libcurl into arm64 code
wstamp="llama-cpp-python==$version $base $cross"
wheels="$cache/wheels"
wheel() { compgen -G "$wheels/llama_cpp_python-$version-*linux_aarch64.whl" | head -n1; }
ensure_wheel() {
  if [ "$(cat "$wheels/stamp" 2>/dev/null)" = "$wstamp" ] && [ -n "$(wheel)" ]; then
    timing wheel-build-seconds "$(cat "$wheels/build.seconds") s, reused from an earlier run"
    return
  fi
  echo "arm-gates: cross-compiling llama-cpp-python $version for arm64 ($(aarch64-linux-gnu-g++ --version | head -n1))"
  "$py" -m pip --version >/dev/null 2>&1 || die "$py has no pip (the wheel is built with it): set PYTHON=/path/to/python3"
  rm -rf "$wheels" && mkdir -p "$wheels"
  t=$(date +%s)
  # _PYTHON_HOST_PLATFORM: the platform the wheel is tagged for (scikit-build-core reads it)
  if ! env CMAKE_ARGS="$base $cross" _PYTHON_HOST_PLATFORM=linux-aarch64 CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      nice -n 19 ionice -c3 "$py" -m pip wheel -q --no-deps --no-cache-dir --no-binary llama-cpp-python \
      "llama-cpp-python==$version" -w "$wheels" >"$wheels/build.log" 2>&1; then
    tail -n 30 "$wheels/build.log"
    die "the arm64 wheel build failed (its log: $wheels/build.log)"
  fi
  [ -n "$(wheel)" ] || die "the build wrote no linux_aarch64 wheel: $(ls "$wheels")"
  # EM_AARCH64 (183) at offset 18 of the ELF header of every library in the wheel
  "$py" - "$(wheel)" <<'EOF' || die "the wheel's libraries are not arm64 (see above)"
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
libs = [n for n in z.namelist() if ".so" in n.rsplit("/", 1)[-1]]
bad = [n for n in libs if z.read(n)[18:20] != b"\xb7\x00"]
print(f"arm-gates: {len(libs)} libraries in the wheel, {len(libs) - len(bad)} of them arm64", *bad, sep="\n  ")
sys.exit(1 if bad or not libs else 0)
EOF
  since "$t" >"$wheels/build.seconds"
  echo "$wstamp" >"$wheels/stamp"
  timing wheel-build-seconds "$(cat "$wheels/build.seconds") s, built by this run"
}
# side by side: debootstrap waits on the network and the emulator, the wheel build on the compiler
ensure_rootfs & rootfs_pid=$!
ensure_wheel & wheel_pid=$!
rootfs_rc=0; wait "$rootfs_pid" || rootfs_rc=$?
wheel_rc=0; wait "$wheel_pid" || wheel_rc=$?
[ "$rootfs_rc" -eq 0 ] && [ "$wheel_rc" -eq 0 ] || die "the root file system or the wheel could not be made (see above)"
# an interpreter registered without the F flag is looked up inside the chroot
for f in /usr/bin/qemu-aarch64-static ${interp:+"$interp"}; do
  mkdir -p "$rootfs$(dirname "$f")" && cp -f "$f" "$rootfs$f"
done
cp -L /etc/resolv.conf "$rootfs/etc/resolv.conf"
# pip inside trusts what the host trusts (a host behind a TLS-intercepting proxy has its CA there, not in Debian's)
ca=/etc/ssl/certs/ca-certificates.crt
[ -f "$ca" ] || die "$ca is missing: apt-get install ca-certificates"
mkdir -p "$rootfs/opt/host" && cp -L "$ca" "$rootfs/opt/host/ca-certificates.crt"

# ---- the project, from this commit's files, installed by its own setup.sh inside ------------------------------
in_rootfs() {  # bash -c "$1" inside the root file system, in a private mount namespace (its mounts die with it)
  nice -n 19 ionice -c3 unshare --mount --propagation private -- /bin/sh -c '
    r=$1; shift
    mount -t proc proc "$r/proc" && mount -t sysfs sysfs "$r/sys" && mount --rbind /dev "$r/dev" || exit 1
    exec chroot "$r" /usr/bin/env -i HOME=/root LANG=C.UTF-8 PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin \
      QEMU_CPU="$1" PIP_FIND_LINKS=/opt/wheels PIP_ONLY_BINARY=llama-cpp-python PIP_NO_CACHE_DIR=1 \
      PIP_CERT=/opt/host/ca-certificates.crt SSL_CERT_FILE=/opt/host/ca-certificates.crt \
      PIP_DISABLE_PIP_VERSION_CHECK=1 /bin/bash -c "$2"' sh "$rootfs" "$qemu_cpu" "$1"
}
dst="$rootfs/opt/bmoe"
mkdir -p "$dst" "$rootfs/opt/wheels" "$rootfs/opt/results"
find "$dst" -mindepth 1 -maxdepth 1 ! -name .venv -exec rm -rf {} +
git -C "$repo" archive --format=tar "$commit" | tar -x -C "$dst"
rm -f "$rootfs"/opt/wheels/*.whl "$rootfs"/opt/results/* "$dst/.venv/.bmoe-installed"  # setup.sh installs again
cp "$(wheel)" "$rootfs/opt/wheels/"
t=$(date +%s)
in_rootfs 'cd /opt/bmoe && PYTHON=python3 scripts/setup.sh' \
  || die "scripts/setup.sh failed inside the root file system (see above)"
timing setup-in-rootfs-seconds "$(since "$t")"

# ---- ARM, not x86: what the emulated machine and llama.cpp say ------------------------------------------------
in_rootfs 'cd /opt/bmoe && echo "uname -m: $(uname -m)" && .venv/bin/python -c "
import platform, llama_cpp
print(\"python:\", platform.python_version(), platform.machine())
print(\"llama.cpp system info:\", llama_cpp.llama_print_system_info().decode().strip())" && .venv/bin/bmoe --version
ls harness/engine/native/*.so' >"$out/system-info.txt" || die "the checks inside the root file system failed (see above)"
cat "$out/system-info.txt"
{ echo "qemu: $(/usr/bin/qemu-aarch64-static --version | head -n1), QEMU_CPU=$qemu_cpu, binfmt_misc flags $binfmt_flags"
  echo "cross compiler: $(aarch64-linux-gnu-g++ --version | head -n1)"
  echo "llama-cpp-python build flags: $base $cross"; } | tee -a "$out/system-info.txt"
grep -qx "uname -m: aarch64" "$out/system-info.txt" || die "the root file system does not run as aarch64"
grep -q "NEON = 1" "$out/system-info.txt" || die "llama.cpp inside was not built with NEON (its system info above)"
grep -q "_cfilter.*aarch64" "$out/system-info.txt" || die "the C helpers were not built for aarch64 inside"

# ---- the gates: one pytest invocation ----------------------------------------------------------------------------
sel=""; [ "$smoke" -eq 0 ] || sel="--smoke"
t=$(date +%s)
rc=0
in_rootfs "cd /opt/bmoe && mapfile -t ids < <(.venv/bin/python -m tests.helpers.arm_gates $sel) &&
  [ \${#ids[@]} -gt 0 ] && echo \"arm-gates: \${#ids[@]} gates\" && .venv/bin/python -m pytest -v -rfE -p no:cacheprovider \
  --basetemp=/tmp/arm-gates --junitxml=/opt/results/junit.xml \"\${ids[@]}\"" || rc=$?
timing gates-seconds "$(since "$t")"
[ -f "$rootfs/opt/results/junit.xml" ] || die "pytest wrote no report (exit $rc; see above)"
cp "$rootfs/opt/results/junit.xml" "$out/junit.xml"
in_rootfs "cd /opt/bmoe && .venv/bin/python -m tests.helpers.arm_gates $sel --summarize /opt/results/junit.xml" \
  >"$out/results.md"
timing rootfs-disk "$(du -sh "$rootfs" | cut -f1) ($(du -sh "$dst/.venv" | cut -f1) of it the venv)"
timing total-seconds "$(since "$start")"

# ---- findings ---------------------------------------------------------------------------------------------------
tail_line="$(grep -E '^=+ .*(passed|failed|error).* in [0-9.]+s' "$out/arm-gates.log" | tail -n1 | tr -d '=' | xargs)"
n_gates="$(grep -o "<testcase " "$out/junit.xml" | wc -l)"
cat >"$out/findings.md" <<EOF
# bmoe's byte-identity gates on llama.cpp's ARM code paths, under emulation

\`scripts/arm-gates.sh${sel:+ $sel}\` at commit \`$commit\` ($(git -C "$repo" log -1 --format=%s "$commit" | cut -c1-100)),
$(date -u '+%F %H:%M') UTC. Raw: \`arm-gates.log\` (the whole run), \`junit.xml\`, \`system-info.txt\`, \`timings.txt\`.

## What ran, and on what

- ${n_gates} gates in one pytest invocation (the node ids \`python -m tests.helpers.arm_gates${sel:+ $sel}\` prints):
  for each architecture the registry lists as covered, streamed == resident with the cache off and with a cache
  small enough to evict on 2 reader lanes, and the wrong-expert negative control where its gate module has one;
  the compiled and Python read lanes; \`--prefetch 1\` and \`--predict-prefetch\` with their negative control.
- An arm64 Debian $suite root file system (\`debootstrap --variant=minbase\`: $(timing_get rootfs-seconds)),
  run through binfmt_misc by $(/usr/bin/qemu-aarch64-static --version | head -n1) (user-mode emulation: the
  guest's instructions translated, the host's Linux kernel answering its system calls), CPU model \`$qemu_cpu\`.
- Inside it the project was installed from this commit's files (\`git archive\`) by its own \`scripts/setup.sh\`
  (the C helpers compiled by the root file system's gcc), with llama-cpp-python $version from a wheel
  cross-compiled on the x86-64 host by $(aarch64-linux-gnu-g++ --version | head -n1) with setup.sh's flags
  (\`-DGGML_LLAMAFILE=OFF\`) and \`-DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=$march\`
  ($(timing_get wheel-build-seconds)). Compiling llama.cpp inside the emulator would have run every compiler
  instruction translated; the cross compiler builds the same arm64 code at native speed.
- ARM, not x86: inside, \`uname -m\` said aarch64 and llama.cpp's system info said:
  \`$(sed -n 's/^llama.cpp system info: //p' "$out/system-info.txt")\`
- Time: setup.sh inside $(timing_get setup-in-rootfs-seconds) s, the gates $(timing_get gates-seconds) s, the whole run
  $(timing_get total-seconds) s. Disk: the root file system takes $(timing_get rootfs-disk).

## Results

pytest: **${tail_line:-no summary line: see arm-gates.log}** (exit $rc).

$(cat "$out/results.md")

## What emulation does not show

- **Speed.** Every ARM instruction is translated to x86-64 by qemu; the seconds above are the emulator's and
  say nothing about a phone's tokens per second, and nothing about NEON against x86's SIMD.
- **ARM's memory ordering.** The guest's threads run on the host's x86-64 cores, whose ordering (TSO) is stronger
  than ARM's: a missing barrier between the read lanes, the evictor thread and the compute thread (or in
  llama.cpp's thread pool) that lets a real ARM core reorder loads and stores cannot show here.
- **Android's kernel and libc.** System calls are answered by this host's Linux kernel and the root file system's
  glibc: not Android's kernel (its vendor patches, O_DIRECT and page-cache behaviour on /data, memory pressure,
  the low-memory killer), not bionic, not SELinux or Termux's storage.
- **Other CPU features.** Only what \`-march=$march\` enables is exercised (NEON, dot product, fp16); llama.cpp's
  i8mm, SVE and KleidiAI kernels were not built.
EOF
echo "arm-gates: findings in $out/findings.md"
exit "$rc"
