"""The pure parts of `harness.devices.adb`: which device to use, what the device's answers say (free space, a
sha256, an exit code), the host-side hash of a file, and the lines of `bmoe-bench devices`."""

from __future__ import annotations

import hashlib
import re
import signal
from pathlib import Path

from harness.errors import UserError


def choose_serial(devices: list[tuple[str, str]], serial: str | None, env_serial: str | None) -> str:
    """Pick the device to use from `adb devices` (serial, state) pairs: the given serial, else
    $ANDROID_SERIAL, else the only device in state "device". UserError listing them otherwise."""
    listing = ", ".join(f"{s} ({st})" for s, st in devices) or "none"
    want = serial or env_serial
    if want:
        states = {s: st for s, st in devices}
        src = "target serial" if serial else "ANDROID_SERIAL"
        if want not in states:
            raise UserError(f"{src} {want}: no such adb device (adb devices lists: {listing})")
        if states[want] != "device":
            raise UserError(f"{src} {want}: adb device is {states[want]}, not ready (adb devices lists: {listing})")
        return want
    ready = [s for s, st in devices if st == "device"]
    if not ready:
        raise UserError(f"no adb device ready (adb devices lists: {listing}); connect one or set its serial")
    if len(ready) > 1:
        raise UserError(f"several adb devices ({listing}); set the campaign's target serial to one of them")
    return ready[0]


def parse_df_available_kib(text: str) -> int | None:
    """Available KiB from `df -Pk DIR` output (POSIX format: header, then one line)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) < 2:
        return None
    fields = " ".join(lines[1:]).split()  # a long filesystem name may wrap onto two lines
    return int(fields[3]) if len(fields) >= 6 and fields[3].isdigit() else None


def parse_sha256(text: str) -> str | None:
    m = re.match(r"\s*([0-9a-fA-F]{64})\b", text)
    return m.group(1).lower() if m else None


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def exit_reason(code: int, stderr_tail: str) -> str:
    """The one-line reason for a non-zero exit over adb. Exit codes there are 8-bit; 128+N usually means
    killed by signal N (137: SIGKILL, which on a phone is often the low-memory killer)."""
    head = f"engine exited {code}"
    if 128 < code < 128 + 32:
        try:
            head += f" (killed by {signal.Signals(code - 128).name}?)"
        except ValueError:
            pass
    tail = last_line(stderr_tail)
    return f"{head}: {tail}" if tail else head


def last_line(text: str, limit: int = 200) -> str:
    """The last non-blank line of text, cut to limit characters."""
    for line in reversed(text.splitlines()):
        s = line.strip()
        if s:
            return s if len(s) <= limit else s[: limit - 3] + "..."
    return ""


def one_line(e: BaseException) -> str:
    """An exception as one line: the last line of its message, else its type's name."""
    return last_line(str(e)) or type(e).__name__


def format_devices(devs: list[dict], details: bool = False) -> list[str]:
    """Lines for `bmoe-bench devices`."""
    if not devs:
        return ["no adb devices (adb server running, none attached or connected)"]
    lines = []
    for d in devs:
        cols = [d["serial"], d["state"]]
        if details and d["state"] == "device":
            if "error" in d:
                cols.append(f"error: {d['error']}")
            else:
                cols.append(d.get("model") or "(no getprop)")
                cols.append(f"Android {d['android_release']}" if d.get("android_release") else (d.get("kernel") or ""))
                free = d.get("free_mib")
                cols.append(f"{free} MiB free in /data/local/tmp" if free is not None else "no /data/local/tmp")
        lines.append("\t".join(cols))
    return lines
