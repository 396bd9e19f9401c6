#!/usr/bin/env bash
# Install a real adbd for the adb tests and print the path of a launcher for it.
#
#   tests/adbd/install-adbd.sh [PREFIX]     (default: $BMOE_TEST_ADBD_PREFIX or ~/.cache/bmoe/test-adbd)
#
# The adbd is Debian 13's `adbd` package (AOSP adbd built for Linux). On Debian >= 13 it comes from the
# machine's own apt. On Debian 12 the trixie .debs (adbd and the libraries it needs) are downloaded with
# a private apt configuration into PREFIX and unpacked there with dpkg-deb -x, and the launcher runs
# adbd through trixie's own dynamic loader with --library-path, so the system's packages are untouched.
# Idempotent: an existing working launcher is reused. The adbd has no authentication and listens on
# every interface: only ever start it inside a private network namespace (see run-adb-tests.sh).
set -euo pipefail

PREFIX="${1:-${BMOE_TEST_ADBD_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/bmoe/test-adbd}}"
LAUNCHER="$PREFIX/adbd"
if [ -x "$LAUNCHER" ]; then echo "$LAUNCHER"; exit 0; fi
mkdir -p "$PREFIX"

major="$(cut -d. -f1 /etc/debian_version 2>/dev/null || echo 0)"
if [ "${major:-0}" -ge 13 ] 2>/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends adbd >&2
    real=/usr/lib/android-sdk/platform-tools/adbd
    [ -x "$real" ] || { echo "install-adbd: apt installed adbd but $real is missing" >&2; exit 1; }
    printf '#!/bin/sh\nexec %s "$@"\n' "$real" > "$LAUNCHER.tmp"
else
    # the Debian mirror this machine already uses (deb822 sources or the one-line format)
    mirror="$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\/debian\/\{0,1\}\)[[:space:]]*$/\1/p' \
        /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)"
    if [ -z "$mirror" ]; then
        mirror="$(awk '$1 == "deb" && $2 ~ /\/debian\/?$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)"
    fi
    [ -n "$mirror" ] || { echo "install-adbd: no Debian mirror in the apt configuration" >&2; exit 1; }
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    [ -r "$keyring" ] || { echo "install-adbd: $keyring missing (apt-get install debian-archive-keyring)" >&2; exit 1; }

    work="$PREFIX/apt.$$"
    root="$PREFIX/root"
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$work/lists/partial" "$work/archives/partial"
    : > "$work/status"
    echo "deb [signed-by=$keyring] $mirror trixie main" > "$work/sources.list"
    opts=(
        -o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/nonexistent
        -o "Dir::State::Lists=$work/lists" -o "Dir::State::status=$work/status"
        -o "Dir::Cache=$work" -o "Dir::Cache::archives=$work/archives"
        -o Acquire::IndexTargets::deb::Contents-deb::DefaultEnabled=false
        -o APT::Install-Recommends=false -o Debug::NoLocking=true -o APT::Sandbox::User=root
    )
    apt-get "${opts[@]}" -qq update >&2
    apt-get "${opts[@]}" -qq -y install --download-only adbd >&2
    rm -rf "$root"; mkdir -p "$root"
    for deb in "$work"/archives/*.deb; do dpkg-deb -x "$deb" "$root"; done
    case "$(uname -m)" in
        x86_64) triplet=x86_64-linux-gnu; ldso=ld-linux-x86-64.so.2 ;;
        aarch64) triplet=aarch64-linux-gnu; ldso=ld-linux-aarch64.so.1 ;;
        *) echo "install-adbd: no loader name known for $(uname -m)" >&2; exit 1 ;;
    esac
    lib="$root/usr/lib/$triplet"
    real="$root/usr/lib/android-sdk/platform-tools/adbd"
    [ -x "$real" ] && [ -e "$lib/$ldso" ] || {
        echo "install-adbd: unpacked tree lacks $real or trixie's $ldso" >&2; exit 1; }
    # --library-path rather than LD_LIBRARY_PATH: the shells adbd starts must use the host's own libc
    printf '#!/bin/sh\nexec %s --library-path %s:%s/android %s "$@"\n' \
        "$lib/$ldso" "$lib" "$lib" "$real" > "$LAUNCHER.tmp"
fi
chmod +x "$LAUNCHER.tmp"
mv "$LAUNCHER.tmp" "$LAUNCHER"
echo "$LAUNCHER"
