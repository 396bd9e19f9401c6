"""An adb device as a target (adbutils): an Android phone, or in tests a real adbd on loopback.

Every command sent to the device is built by `sh_join` (shlex.quote on every word), so a prompt or a
path from a campaign can never be read as shell. Files are staged under `device_dir`
(/data/local/tmp/bmoe by default): pushed only when their size or sha256 on the device differs, after a
free-space check, to a temporary name then renamed, and verified after the push. A run is

    cd RUN_DIR && timeout -k 5 N sh -c 'echo $$ > PIDFILE && exec "$@"' sh ENGINE ARGS...

over adb's shell v2 protocol (separate stdout/stderr, exit code): the engine's own PID is in PIDFILE, so
on Ctrl-C or a host-side timeout it is killed by PID (adb's socket timeout alone leaves it running).
A device that goes away mid-run gives a failed RunOutcome with reason "device gone: ...", not an error.
The engine it was running may still be running there (adbd gone, or the USB link): the target remembers
it, and before its next run (or at close) kills it if the device is back, so a run never shares the
device with a leftover engine. The engine runs with BMOE_RUN_MARK=PIDFILE in its environment, and only a
process carrying that mark is killed (a PID reused meanwhile is left alone); the run's log says so.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import shlex
import time
from collections import deque
from pathlib import Path

import adbutils
from adbutils import AdbClient, AdbDevice

from harness.errors import UserError
from harness.targets import devstate
from harness.targets.base import LineCallback, RunOutcome, last_line

DEFAULT_DEVICE_DIR = "/data/local/tmp/bmoe"
_SPACE_MARGIN_KIB = 64 * 1024  # keep this much free on the device after a push
_SHORT_TIMEOUT_S = 60.0
_HASH_TIMEOUT_S = 3600.0  # sha256 of a 60 GB model on a phone takes a few minutes
_HOST_GRACE_S = 15.0  # host-side deadline beyond the device-side `timeout`
_counter = itertools.count()

# exceptions meaning the adb server or the device connection failed
_ADB_ERRORS = (adbutils.AdbError, OSError, EOFError)


def sh_join(words: list[str] | tuple[str, ...]) -> str:
    """One shell command line in which every word is a literal (shlex.quote on each)."""
    return " ".join(shlex.quote(str(w)) for w in words)


# ---- pure helpers --------------------------------------------------------------------------------------


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


# The device description in one round trip; constant text. getprop is absent on a Linux adbd.
_DESCRIBE_SCRIPT = r"""for p in ro.product.manufacturer ro.product.model ro.product.device ro.board.platform \
  ro.soc.model ro.build.version.release ro.build.version.sdk ro.product.cpu.abi; do
  echo "$p=$(getprop "$p" 2>/dev/null)"
done
echo "uname=$(uname -srm 2>/dev/null)"
echo "cpus=$(grep -c '^processor' /proc/cpuinfo 2>/dev/null)"
echo "hardware=$(grep -m1 -E '^(Hardware|model name)' /proc/cpuinfo 2>/dev/null | cut -d: -f2-)"
"""

# Hash of one file ($1): sha256sum where present, else toybox's.
_SHA256_SCRIPT = r"""if command -v sha256sum >/dev/null 2>&1; then exec sha256sum "$1"
elif command -v toybox >/dev/null 2>&1; then exec toybox sha256sum "$1"
else echo "no sha256sum or toybox on the device" >&2; exit 127; fi"""

# Run the engine with its PID in $1; the rest of the words are the engine's argv.
_PID_WRAPPER = 'export BMOE_RUN_MARK="$0" && echo $$ > "$0" && exec "$@"'
# kill the process in pidfile $1 only if it carries the run's mark; print its PID if killed
_REAP = (
    'p=$(cat "$1" 2>/dev/null) || exit 0; '
    'if [ -n "$p" ] && tr "\\000" "\\n" 2>/dev/null < "/proc/$p/environ" | grep -qxF -- "BMOE_RUN_MARK=$1"; '
    'then kill -KILL "$p" && echo "$p"; fi; rm -f "$1"'
)


class DeviceGone(Exception):
    """The device or the adb server stopped answering."""


class AdbTarget:
    """Runs engines on an adb device.

    serial: which device (else $ANDROID_SERIAL, else the only one ready); device_dir: where staged files
    and run outputs go on the device (default /data/local/tmp/bmoe; the Linux adbd in tests has a
    tmpfs there). adb server at host:port (adbutils starts a local one if none is running). prepare:
    create device_dir and its runs/ dir now (False only to look at a device, as `devices -l` does).
    """

    kind = "adb"

    def __init__(
        self,
        serial: str | None = None,
        *,
        device_dir: str = DEFAULT_DEVICE_DIR,
        host: str = "127.0.0.1",
        port: int = 5037,
        prepare: bool = True,
    ):
        if not device_dir.startswith("/"):
            raise UserError(f"device_dir {device_dir!r}: must be an absolute path on the device")
        self.device_dir = device_dir.rstrip("/") or "/"
        self.client = AdbClient(host=host, port=port)
        try:
            infos = [(d.serial, d.state) for d in self.client.list()]
        except _ADB_ERRORS as e:
            raise UserError(f"adb is not usable: {_one_line(e)}") from e
        self.serial = choose_serial(infos, serial, os.environ.get("ANDROID_SERIAL"))
        self.device: AdbDevice = self.client.device(serial=self.serial)
        self._hash_cache: dict[tuple[str, int, int], str] = {}
        self.stage_log: list[tuple[str, str]] = []  # (remote path, "pushed" | "unchanged")
        self._orphans: list[str] = []  # pidfiles of runs that lost the device while their engine ran
        if prepare:
            self._shell_ok(sh_join(["mkdir", "-p", self.device_dir, self.run_dir()]), what="create the device dir")

    # ---- device commands -------------------------------------------------------------------------------

    def shell(self, cmd: str, timeout: float = _SHORT_TIMEOUT_S) -> tuple[int, str, str]:
        """Run one already-quoted command line; (exit code, stdout, stderr). Raises DeviceGone."""
        try:
            r = self.device.shell2(cmd, timeout=timeout, v2=True)
        except _ADB_ERRORS as e:
            raise DeviceGone(self._gone_reason(e)) from e
        return r.returncode, r.stdout, r.stderr

    def _shell_ok(self, cmd: str, what: str, timeout: float = _SHORT_TIMEOUT_S) -> str:
        try:
            code, out, err = self.shell(cmd, timeout)
        except DeviceGone as e:
            raise UserError(f"adb device {self.serial}: cannot {what}: {e}") from e
        if code != 0:
            raise UserError(f"adb device {self.serial}: cannot {what}: {last_line(err or out) or f'exit {code}'}")
        return out

    def _script(self, script: str, *args: str) -> str:
        return sh_join(["sh", "-c", script, "sh", *args])

    def _gone_reason(self, e: BaseException | None = None) -> str:
        try:
            states = {d.serial: d.state for d in self.client.list()}
        except _ADB_ERRORS as le:
            return f"adb server not answering ({_one_line(le)})"
        st = states.get(self.serial)
        if st is None:
            return f"{self.serial} is no longer listed by adb"
        if st != "device":
            return f"{self.serial} is {st}"
        return f"{self.serial}: {_one_line(e) if e else 'connection lost'}"

    # ---- Target protocol -------------------------------------------------------------------------------

    def describe(self) -> dict:
        out = self._shell_ok(self._script(_DESCRIBE_SCRIPT), what="describe the device")
        kv = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        props = {k: (v.strip() or None) for k, v in kv.items()}
        mem = devstate.parse_meminfo(self.shell(sh_join(["cat", "/proc/meminfo"]))[1])
        cpus = props.get("cpus")
        return {
            "kind": "adb",
            "serial": self.serial,
            "manufacturer": props.get("ro.product.manufacturer"),
            "model": props.get("ro.product.model"),
            "device": props.get("ro.product.device"),
            "platform": props.get("ro.board.platform") or props.get("ro.soc.model"),
            "android_release": props.get("ro.build.version.release"),
            "sdk": props.get("ro.build.version.sdk"),
            "abi": props.get("ro.product.cpu.abi"),
            "kernel": props.get("uname"),
            "hardware": props.get("hardware"),
            "cpus": int(cpus) if cpus and cpus.isdigit() else None,
            "mem_total_mib": mem["mem_total_mib"],
            "device_dir": self.device_dir,
            "device_dir_free_mib": round(free / 1024) if (free := self.free_kib(self.device_dir)) is not None else None,
        }

    def run_dir(self) -> str:
        return f"{self.device_dir}/runs"

    def remote_size(self, path: str) -> int | None:
        code, out, _ = self.shell(sh_join(["stat", "-c", "%s", path]))
        s = out.strip()
        return int(s) if code == 0 and s.isdigit() else None

    def remote_sha256(self, path: str) -> str | None:
        code, out, err = self.shell(self._script(_SHA256_SCRIPT, path), timeout=_HASH_TIMEOUT_S)
        if code == 127:
            raise UserError(f"adb device {self.serial}: {last_line(err)}")
        return parse_sha256(out) if code == 0 else None

    def free_kib(self, path: str) -> int | None:
        code, out, _ = self.shell(sh_join(["df", "-Pk", path]))
        return parse_df_available_kib(out) if code == 0 else None

    def _local_sha256(self, p: Path) -> str:
        st = p.stat()
        key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
        if key not in self._hash_cache:
            self._hash_cache[key] = file_sha256(p)
        return self._hash_cache[key]

    def stage(self, local: Path, kind: str) -> str:
        p = Path(local)
        if not p.is_file():
            raise UserError(f"{kind}: {p} does not exist or is not a file")
        remote = f"{self.device_dir}/{p.name}"
        size = p.stat().st_size
        want = self._local_sha256(p)
        try:
            have_size = self.remote_size(remote)
            if have_size == size and self.remote_sha256(remote) == want:
                self.stage_log.append((remote, "unchanged"))
                return remote
            free = self.free_kib(self.device_dir)
            need = -(-size // 1024) + _SPACE_MARGIN_KIB - (have_size or 0) // 1024
            if free is None:
                raise UserError(f"adb device {self.serial}: cannot read free space of {self.device_dir} (df)")
            if free < need:
                raise UserError(
                    f"{kind} {p.name}: needs {need / 1024:.0f} MiB free in {self.device_dir} on {self.serial} "
                    f"(including a {_SPACE_MARGIN_KIB // 1024} MiB margin), only {free / 1024:.0f} MiB free"
                )
            part = f"{remote}.part"
            mode = 0o755 if kind == "engine" or os.access(p, os.X_OK) else 0o644
            try:
                self.device.sync.push(str(p), part, mode=mode)
            except _ADB_ERRORS as e:
                self.shell(sh_join(["rm", "-f", part]))
                raise UserError(f"{kind} {p.name}: push to {self.serial} failed: {_one_line(e)}") from e
            self._shell_ok(sh_join(["mv", "-f", part, remote]), what=f"rename {part}")
            got_size, got_hash = self.remote_size(remote), self.remote_sha256(remote)
        except DeviceGone as e:
            raise UserError(f"{kind} {p.name}: adb device went away while staging: {e}") from e
        if got_size != size or got_hash != want:
            raise UserError(
                f"{kind} {p.name}: on {self.serial} after the push it has size {got_size} and sha256 "
                f"{got_hash}, expected {size} and {want}"
            )
        self.stage_log.append((remote, "pushed"))
        return remote

    def sample_state(self) -> dict:
        """One device-state sample in one shell round trip. If the device is gone, the sample has no
        readings (None/empty) and an "error" key with the reason."""
        t = time.time()
        try:
            code, out, _ = self.shell(self._script(devstate.STATE_SCRIPT), timeout=10.0)
        except DeviceGone as e:
            s = devstate.parse_state_dump("", t=t)
            s["error"] = f"device gone: {e}"
            return s
        return devstate.parse_state_dump(out, t=t)

    def drop_caches(self) -> bool:
        """Drop the device's page cache: only possible on a rooted device (adb root); False otherwise."""
        try:
            code, _, _ = self.shell("sync && echo 3 > /proc/sys/vm/drop_caches")
        except DeviceGone:
            return False
        return code == 0

    def close(self) -> None:
        self.reap_orphans()

    def reap_orphans(self) -> list[str]:
        """Kill engines left running by earlier runs that lost the device, if it answers now; one log
        line per engine killed. Runs that still cannot be reached are kept for the next call."""
        notes, left = [], []
        for pidfile in self._orphans:
            try:
                code, out, _ = self.shell(sh_join(["sh", "-c", _REAP, "reap", pidfile]), timeout=10.0)
            except DeviceGone:
                left.append(pidfile)
                continue
            pid = out.strip()
            if code == 0 and pid.isdigit():
                notes.append(f"[bmoe-bench] killed engine pid {pid} on the device: an earlier run lost the "
                             "device while it ran, and it was still running")
        self._orphans = left
        return notes

    def kill_remote(self, pid: int, sig: str = "KILL") -> bool:
        try:
            code, _, _ = self.shell(sh_join(["kill", f"-{sig}", str(pid)]))
        except DeviceGone:
            return False
        return code == 0

    def run(
        self,
        argv: list[str],
        *,
        timeout_s: float,
        outputs: list[str],
        out_dir: Path,
        log_path: Path,
        on_stdout_line: LineCallback | None = None,
    ) -> RunOutcome:
        if not argv:
            raise UserError("engine command is empty")
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        reaped = self.reap_orphans()
        pidfile = f"{self.run_dir()}/.bmoe-{os.getpid()}-{next(_counter)}.pid"
        secs = max(1, int(round(timeout_s)))
        cmd = " ".join(
            [
                sh_join(["cd", self.run_dir()]),
                "&&",
                sh_join(["timeout", "-k", "5", str(secs), "sh", "-c", _PID_WRAPPER, pidfile, *argv]),
            ]
        )
        t0 = time.monotonic()
        with open(log_path, "w", encoding="utf-8") as log:
            for note in reaped:
                log.write(note + "\n")
            stream = _V2Stream(log, on_stdout_line)
            try:
                conn = self.device.open_transport(timeout=_SHORT_TIMEOUT_S)
                conn.send_command(f"shell,v2:{cmd}")
                conn.check_okay()
            except _ADB_ERRORS as e:
                return RunOutcome(None, f"device gone: {self._gone_reason(e)}", time.monotonic() - t0)
            pid: int | None = None
            gone: str | None = None
            host_timeout = False
            try:
                sock = conn.conn
                sock.settimeout(0.5)
                deadline = t0 + secs + _HOST_GRACE_S
                while stream.exit_code is None:
                    if pid is None and time.monotonic() - t0 > 0.2:
                        pid = self._read_pid(pidfile)
                    if time.monotonic() > deadline:
                        host_timeout = True
                        break
                    try:
                        data = sock.recv(65536)
                    except TimeoutError:
                        continue
                    except OSError as e:
                        gone = self._gone_reason(e)
                        break
                    if not data:
                        gone = self._gone_reason()
                        break
                    stream.feed(data)
            except BaseException:  # KeyboardInterrupt: kill the engine on the device, then re-raise
                self._kill_pidfile(pid, pidfile)
                raise
            finally:
                conn.close()
            wall = time.monotonic() - t0
            stream.flush()
            if pid is None:
                pid = self._read_pid(pidfile)
            if host_timeout:
                self._kill_pidfile(pid, pidfile)
                log.write(f"[bmoe-bench] killed on the device after the {timeout_s:g} s timeout\n")
        if stream.cb_error is not None:
            raise stream.cb_error

        code = stream.exit_code
        if gone is not None:
            self._orphans.append(pidfile)  # its engine may still be running there
            return RunOutcome(None, f"device gone: {gone}", wall, remote_pid=pid)
        try:
            self.shell(sh_join(["rm", "-f", pidfile]))
        except DeviceGone as e:
            return RunOutcome(code, f"device gone: {e}", wall, remote_pid=pid)
        reason: str | None = None
        if host_timeout or (code == 124 and wall >= secs - 1):
            reason = f"timeout after {timeout_s:g} s"
            code = None
        elif code == 137 and wall >= secs + 4:  # timeout -k had to SIGKILL it
            reason = f"timeout after {timeout_s:g} s"
            code = None
        elif code is not None and code != 0:
            reason = _adb_exit_reason(code, "\n".join(stream.stderr_tail))
        fetched, missing, pull_err = self._pull(outputs, out_dir)
        if reason is None and pull_err:
            reason = f"device gone: {pull_err}"
        elif reason is None and missing:
            reason = f"engine exited 0 but did not write {missing[0]}"
        return RunOutcome(code, reason, wall, fetched, remote_pid=pid)

    # ---- run helpers -----------------------------------------------------------------------------------

    def _read_pid(self, pidfile: str) -> int | None:
        try:
            code, out, _ = self.shell(sh_join(["cat", pidfile]), timeout=5.0)
        except DeviceGone:
            return None
        s = out.strip()
        return int(s) if code == 0 and s.isdigit() else None

    def _kill_pidfile(self, pid: int | None, pidfile: str) -> None:
        pid = pid if pid is not None else self._read_pid(pidfile)
        if pid is not None:
            self.kill_remote(pid, "KILL")
        try:
            self.shell(sh_join(["rm", "-f", pidfile]), timeout=5.0)
        except DeviceGone:
            pass

    def _pull(self, outputs: list[str], out_dir: Path) -> tuple[dict[str, Path], list[str], str | None]:
        """Pull each output into out_dir (size-checked); outputs inside run_dir() are then deleted on the
        device, so run files do not pile up on a phone. Relative paths are relative to run_dir()."""
        fetched: dict[str, Path] = {}
        missing: list[str] = []
        for remote in outputs:
            path = remote if remote.startswith("/") else f"{self.run_dir()}/{remote}"
            try:
                size = self.remote_size(path)
                if size is None:
                    missing.append(remote)
                    continue
                dest = out_dir / Path(path).name
                tmp = dest.with_name(dest.name + ".part")
                self.device.sync.pull(path, str(tmp))
                got = tmp.stat().st_size
                if got != size:
                    return fetched, missing, f"{self.serial}: pull of {path} incomplete ({got} of {size} bytes)"
                tmp.replace(dest)
                if path.startswith(self.run_dir() + "/"):
                    self.shell(sh_join(["rm", "-f", path]))
            except DeviceGone as e:
                return fetched, missing, str(e)
            except _ADB_ERRORS as e:
                return fetched, missing, self._gone_reason(e)
            fetched[remote] = dest
        return fetched, missing, None


class _V2Stream:
    """Decodes adb shell v2 frames (id byte, little-endian u32 length, payload): 1 stdout, 2 stderr,
    3 exit code. Writes both streams to the log and stdout lines to the callback."""

    def __init__(self, log, on_stdout_line: LineCallback | None):
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


def _adb_exit_reason(code: int, stderr_tail: str) -> str:
    """Exit codes over adb are 8-bit; 128+N usually means killed by signal N (137: SIGKILL, which on a
    phone is often the low-memory killer)."""
    import signal

    head = f"engine exited {code}"
    if 128 < code < 128 + 32:
        try:
            head += f" (killed by {signal.Signals(code - 128).name}?)"
        except ValueError:
            pass
    tail = last_line(stderr_tail)
    return f"{head}: {tail}" if tail else head


def _one_line(e: BaseException) -> str:
    return last_line(str(e)) or type(e).__name__


# ---- `bmoe-bench devices` -----------------------------------------------------------------------------


def device_summaries(host: str = "127.0.0.1", port: int = 5037, details: bool = False) -> list[dict]:
    """[{serial, state, and with details for ready devices: model, android_release, free_mib}]."""
    try:
        infos = AdbClient(host=host, port=port).list()
    except _ADB_ERRORS as e:
        raise UserError(f"adb is not usable (server {host}:{port}): {_one_line(e)}") from e
    out = []
    for info in infos:
        d: dict = {"serial": info.serial, "state": info.state}
        if details and info.state == "device":
            try:
                t = AdbTarget(info.serial, host=host, port=port, prepare=False)
                desc = t.describe()
                d["model"] = " ".join(x for x in (desc["manufacturer"], desc["model"]) if x) or None
                d["android_release"] = desc["android_release"]
                d["kernel"] = desc["kernel"]
                free = t.free_kib("/data/local/tmp")
                d["free_mib"] = round(free / 1024) if free is not None else None
            except (UserError, DeviceGone) as e:
                d["error"] = str(e)
        out.append(d)
    return out


def format_devices(devs: list[dict], details: bool = False) -> list[str]:
    """Lines for `bmoe-bench devices` (pure)."""
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
