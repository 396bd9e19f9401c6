"""What is sent to a device's shell, over adb or SSH: the quoting of every command line (`sh_join`) and the
constant sh scripts run there (the description, a file's hash, the run's PID wrapper, the reaper of a lost run's
process). Pure: no connection here."""

from __future__ import annotations

import shlex


def sh_join(words: list[str] | tuple[str, ...]) -> str:
    """One shell command line in which every word is a literal (shlex.quote on each)."""
    return " ".join(shlex.quote(str(w)) for w in words)


def script(text: str, *args: str) -> str:
    """The command line running a constant sh script with literal arguments $1..."""
    return sh_join(["sh", "-c", text, "sh", *args])


# The device description in one round trip; constant text. getprop is absent on a Linux adbd.
DESCRIBE_SCRIPT = r"""for p in ro.product.manufacturer ro.product.model ro.product.device ro.board.platform \
  ro.soc.model ro.build.version.release ro.build.version.sdk ro.product.cpu.abi ro.build.fingerprint; do
  echo "$p=$(getprop "$p" 2>/dev/null)"
done
echo "uname=$(uname -srm 2>/dev/null)"
echo "cpus=$(grep -c '^processor' /proc/cpuinfo 2>/dev/null)"
echo "hardware=$(grep -m1 -E '^(Hardware|model name)' /proc/cpuinfo 2>/dev/null | cut -d: -f2-)"
"""

# Hash of one file ($1): sha256sum where present, else toybox's.
SHA256_SCRIPT = r"""if command -v sha256sum >/dev/null 2>&1; then exec sha256sum "$1"
elif command -v toybox >/dev/null 2>&1; then exec toybox sha256sum "$1"
else echo "no sha256sum or toybox on the device" >&2; exit 127; fi"""

# Run a process with its PID in $0; the rest of the words are its argv.
PID_WRAPPER = 'export BMOE_RUN_MARK="$0" && echo $$ > "$0" && exec "$@"'
# kill the process in pidfile $1 only if it carries the run's mark; print its PID if killed
REAP = (
    'p=$(cat "$1" 2>/dev/null) || exit 0; '
    'if [ -n "$p" ] && tr "\\000" "\\n" 2>/dev/null < "/proc/$p/environ" | grep -qxF -- "BMOE_RUN_MARK=$1"; '
    'then kill -KILL "$p" && echo "$p"; fi; rm -f "$1"'
)
