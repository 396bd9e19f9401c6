"""What `harness.adb` sends to a device's shell and how it reads the answer: the quoting of every command
line (`sh_join`), the constant sh scripts it runs there, and the decoder of adb's shell v2 protocol
(`V2Stream`: separate stdout and stderr, then the exit code). Pure: no adb connection here."""

from __future__ import annotations

import shlex
from collections import deque
from collections.abc import Callable
from typing import TextIO

LineCallback = Callable[[str], None]


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


class V2Stream:
    """Decodes adb shell v2 frames (id byte, little-endian u32 length, payload): 1 stdout, 2 stderr,
    3 exit code. Writes both streams to the log and stdout lines to the callback."""

    def __init__(self, log: TextIO, on_stdout_line: LineCallback | None):
        self.buf = b""
        self.log = log
        self.cb = on_stdout_line
        self.cb_error: BaseException | None = None
        self.partial = {1: b"", 2: b""}
        self.stderr_tail: deque[str] = deque(maxlen=20)
        self.exit_code: int | None = None

    def feed(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= 5 and self.exit_code is None:
            kind, length = self.buf[0], int.from_bytes(self.buf[1:5], "little")
            if len(self.buf) < 5 + length:
                return
            payload, self.buf = self.buf[5 : 5 + length], self.buf[5 + length :]
            if kind == 3:
                self.exit_code = payload[0] if payload else 255
            elif kind in (1, 2):
                self._lines(kind, payload)

    def _lines(self, kind: int, payload: bytes) -> None:
        data = self.partial[kind] + payload
        *complete, self.partial[kind] = data.split(b"\n")
        for raw in complete:
            self._line(kind, raw.decode("utf-8", errors="replace").rstrip("\r"))

    def _line(self, kind: int, text: str) -> None:
        self.log.write(text + "\n")
        self.log.flush()
        if kind == 2:
            self.stderr_tail.append(text)
        elif self.cb is not None and self.cb_error is None:
            try:
                self.cb(text)
            except BaseException as e:  # reported after the run
                self.cb_error = e

    def flush(self) -> None:
        for kind in (1, 2):
            if self.partial[kind]:
                raw, self.partial[kind] = self.partial[kind], b""
                self._line(kind, raw.decode("utf-8", errors="replace").rstrip("\r"))
