"""Android devices over adbutils: connect, push (size and sha256 checked), run with exit codes and kill
by PID, pull, and device-state reads. An Android phone, or in tests a real adbd on loopback.

Every command sent to the device is built by `sh_join` (shlex.quote on every word), so a prompt or a
path from a campaign can never be read as shell. `Device.push` copies a file only when its size or
sha256 on the device differs, after a free-space check, to a temporary name then renamed, and verifies
it after the copy. `Device.run` runs

    cd CWD && timeout -k 5 N sh -c 'echo $$ > PIDFILE && exec "$@"' sh ARGV...

over adb's shell v2 protocol (separate stdout/stderr, exit code): the process's own PID is in PIDFILE,
so on Ctrl-C or a host-side timeout it is killed by PID (adb's socket timeout alone leaves it running).
A device that goes away mid-run gives a `ShellRun` whose `gone` says why, not an error. The process may
still be running there (adbd gone, or the USB link): the device remembers it, and before its next run
(or at `reap_orphans`) kills it if the device is back, so a run never shares the device with a leftover
process. The process runs with BMOE_RUN_MARK=PIDFILE in its environment, and only a process carrying
that mark is killed (a PID reused meanwhile is left alone); the run's log says so.

`harness.targets.adb.AdbTarget` builds the campaign runner's Target on this; `bmoe-bench devices` uses
`harness.adb_devices`. The command lines, scripts and the shell v2 decoder
are in `harness.adb_shell`, the pure parsers in `harness.adb_parse`.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import adbutils
from adbutils import AdbDevice

from harness import devstate, interrupts
from harness.adb_client import ServerClient
from harness.adb_parse import choose_serial, file_sha256, last_line, one_line, parse_df_available_kib, parse_sha256
from harness.adb_shell import (
    DESCRIBE_SCRIPT,
    PID_WRAPPER,
    REAP,
    SHA256_SCRIPT,
    LineCallback,
    V2Stream,
    script,
    sh_join,
)
from harness.errors import BmoeError, UserError
from harness.link_timeouts import LIMITS, unbounded

SPACE_MARGIN_KIB = 64 * 1024  # keep this much free on the device after a push
_HASH_TIMEOUT_S = 3600.0  # sha256 of a 60 GB model on a phone takes a few minutes
_HOST_GRACE_S = 15.0  # host-side deadline beyond the device-side `timeout`
_STOP_BUDGET_S = 1.5  # Ctrl-C or SIGTERM: the engine's kill on the device gets this long (else reaped later)
_counter = itertools.count()

# exceptions meaning the adb server or the device connection failed
ADB_ERRORS = (adbutils.AdbError, OSError, EOFError)
_local_hashes: dict[tuple[str, int, int], str] = {}  # a local file's sha256, shared by every Device (a fleet
_hash_lock = threading.Lock()  # pushes one model to each device: hashed once, not once per device)


class DeviceGone(BmoeError):
    """The device or the adb server stopped answering (one line, exit 1, where no caller turns it into a failed
    run or an unreachable device)."""


@dataclass
class ShellRun:
    """One process run on the device by `Device.run`."""

    exit_code: int | None  # None when no exit code came back (device gone, timed out)
    wall_s: float  # from the start of the command to its end, measured on the host
    pid: int | None  # the process's PID on the device, if it was read
    gone: str | None = None  # why the device stopped answering mid-run, if it did
    timed_out: bool = False  # killed after timeout_s (on the device, or from the host)
    stderr_tail: str = ""  # the last stderr lines, for a one-line reason


class Device:
    """One adb device, chosen by serial (else $ANDROID_SERIAL, else the only one ready), through the adb
    server at host:port (never one started here: harness.adb_client). `stop` set from another thread ends
    a run in progress as Ctrl-C does (the process killed by PID, KeyboardInterrupt raised in run's thread)."""

    def __init__(self, serial: str | None = None, *, host: str = "127.0.0.1", port: int = 5037):
        self.client = ServerClient(host=host, port=port)
        self.serial = serial or ""
        self.serial = self.ready(os.environ.get("ANDROID_SERIAL") if serial is None else None)
        self._dev: AdbDevice = self.client.device(serial=self.serial)
        self._orphans: list[str] = []  # pidfiles of runs that lost the device while their process ran
        self.stop = threading.Event()

    def ready(self, env_serial: str | None = None) -> str:
        """The serial, once the server lists the device as ready; UserError saying why not otherwise."""
        try:
            infos = [(d.serial, d.state) for d in self.client.list()]
        except ADB_ERRORS as e:
            raise UserError(f"adb is not usable: {one_line(e)}") from e
        return choose_serial(infos, self.serial or None, env_serial)

    # ---- commands --------------------------------------------------------------------------------------

    def shell(self, cmd: str, timeout: float | None = None) -> tuple[int, str, str]:
        """Run one already-quoted command line; (exit code, stdout, stderr). Raises DeviceGone. Bounded by timeout,
        else by the command's call bound (harness.link_timeouts)."""
        try:
            r = self._dev.shell2(cmd, timeout=timeout or LIMITS.call_s, v2=True)
        except ADB_ERRORS as e:
            raise DeviceGone(self.gone_reason(e)) from e
        return r.returncode, r.stdout, r.stderr

    def shell_ok(self, cmd: str, what: str, timeout: float | None = None) -> str:
        """stdout of a command that must succeed; UserError "cannot <what>: ..." otherwise."""
        try:
            code, out, err = self.shell(cmd, timeout)
        except DeviceGone as e:
            raise UserError(f"adb device {self.serial}: cannot {what}: {e}") from e
        if code != 0:
            raise UserError(f"adb device {self.serial}: cannot {what}: {last_line(err or out) or f'exit {code}'}")
        return out

    def gone_reason(self, e: BaseException | None = None) -> str:
        """Why the device is not answering, from what adb lists now."""
        try:
            states = {d.serial: d.state for d in self.client.list()}
        except ADB_ERRORS as le:
            return f"adb server not answering ({one_line(le)})"
        st = states.get(self.serial)
        if st is None:
            return f"{self.serial} is no longer listed by adb"
        if st != "device":
            return f"{self.serial} is {st}"
        return f"{self.serial}: {one_line(e) if e else 'connection lost'}"

    # ---- device-state reads ----------------------------------------------------------------------------

    def describe(self) -> dict:
        """What the device is: build properties (None on a Linux adbd), kernel, CPUs, memory."""
        out = self.shell_ok(script(DESCRIBE_SCRIPT), what="describe the device")
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
            "fingerprint": props.get("ro.build.fingerprint"),
            "server": self.client.name,
        }

    def sample_state(self) -> dict:
        """One device-state sample in one shell round trip. If the device is gone, the sample has no
        readings (None/empty) and an "error" key with the reason."""
        t = time.time()
        try:
            _, out, _ = self.shell(script(devstate.STATE_SCRIPT), timeout=10.0)
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

    def remote_size(self, path: str) -> int | None:
        code, out, _ = self.shell(sh_join(["stat", "-c", "%s", path]))
        s = out.strip()
        return int(s) if code == 0 and s.isdigit() else None

    def remote_sha256(self, path: str) -> str | None:
        code, out, err = self.shell(script(SHA256_SCRIPT, path), timeout=_HASH_TIMEOUT_S)
        if code == 127:
            raise UserError(f"adb device {self.serial}: {last_line(err)}")
        return parse_sha256(out) if code == 0 else None

    def free_kib(self, path: str) -> int | None:
        code, out, _ = self.shell(sh_join(["df", "-Pk", path]))
        return parse_df_available_kib(out) if code == 0 else None

    # ---- files -----------------------------------------------------------------------------------------

    def _local_sha256(self, p: Path) -> str:
        st = p.stat()
        key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
        with _hash_lock:
            if key not in _local_hashes:
                _local_hashes[key] = file_sha256(p)
            return _local_hashes[key]

    def push(self, local: Path, remote: str, kind: str, *, executable: bool = False) -> str:
        """Copy local to the path remote on the device unless a file of the same size and sha256 is
        there already: "unchanged" or "pushed". Checks free space first (with a margin), writes
        remote.part then renames it, and verifies size and sha256 after. kind names the file in errors."""
        p = Path(local)
        if not p.is_file():
            raise UserError(f"{kind}: {p} does not exist or is not a file")
        size = p.stat().st_size
        want = self._local_sha256(p)
        parent = remote.rsplit("/", 1)[0] or "/"
        try:
            have_size = self.remote_size(remote)
            if have_size == size and self.remote_sha256(remote) == want:
                return "unchanged"
            free = self.free_kib(parent)
            need = -(-size // 1024) + SPACE_MARGIN_KIB - (have_size or 0) // 1024
            if free is None:
                raise UserError(f"adb device {self.serial}: cannot read free space of {parent} (df)")
            if free < need:
                raise UserError(
                    f"{kind} {p.name}: needs {need / 1024:.0f} MiB free in {parent} on {self.serial} "
                    f"(including a {SPACE_MARGIN_KIB // 1024} MiB margin), only {free / 1024:.0f} MiB free"
                )
            part = f"{remote}.part"
            mode = 0o755 if executable or os.access(p, os.X_OK) else 0o644
            try:
                with unbounded():  # a large file: bounded by the stall, not by one call's time
                    self._dev.sync.push(str(p), part, mode=mode)
            except ADB_ERRORS as e:
                self.shell(sh_join(["rm", "-f", part]))
                raise UserError(f"{kind} {p.name}: push to {self.serial} failed: {one_line(e)}") from e
            self.shell_ok(sh_join(["mv", "-f", part, remote]), what=f"rename {part}")
            got_size, got_hash = self.remote_size(remote), self.remote_sha256(remote)
        except DeviceGone as e:
            raise UserError(f"{kind} {p.name}: adb device went away while staging: {e}") from e
        if got_size != size or got_hash != want:
            raise UserError(
                f"{kind} {p.name}: on {self.serial} after the push it has size {got_size} and sha256 "
                f"{got_hash}, expected {size} and {want}"
            )
        return "pushed"

    def pull(self, remote: str, dest: Path) -> bool:
        """Copy remote from the device to dest (through dest.part, size-checked). False if there is no
        such file on the device; DeviceGone if the device stops answering or the copy comes up short."""
        size = self.remote_size(remote)
        if size is None:
            return False
        tmp = dest.with_name(dest.name + ".part")
        try:
            with unbounded():
                self._dev.sync.pull(remote, str(tmp))
        except ADB_ERRORS as e:
            raise DeviceGone(self.gone_reason(e)) from e
        got = tmp.stat().st_size
        if got != size:
            raise DeviceGone(f"{self.serial}: pull of {remote} incomplete ({got} of {size} bytes)")
        tmp.replace(dest)
        return True

    # ---- processes -------------------------------------------------------------------------------------

    def run(self, argv: list[str], *, cwd: str, timeout_s: float, log: TextIO,
            on_stdout_line: LineCallback | None = None) -> ShellRun:
        """Run argv in cwd on the device, killed after timeout_s; stdout and stderr lines go to log as
        they arrive, stdout lines (without newline) to on_stdout_line, from this thread. An exception
        raised by the callback is re-raised after the run; KeyboardInterrupt kills the process by PID
        and is re-raised. Leftovers of earlier runs that lost the device are reaped first (logged)."""
        for note in self.reap_orphans():
            log.write(note + "\n")
        pidfile = f"{cwd}/.bmoe-{os.getpid()}-{next(_counter)}.pid"
        secs = max(1, int(round(timeout_s)))
        cmd = " ".join([sh_join(["cd", cwd]), "&&",
                        sh_join(["timeout", "-k", "5", str(secs), "sh", "-c", PID_WRAPPER, pidfile, *argv])])
        t0 = time.monotonic()
        stream = V2Stream(log, on_stdout_line)
        try:
            conn = self._dev.open_transport(timeout=LIMITS.call_s)
            conn.send_command(f"shell,v2:{cmd}")
            conn.check_okay()
            conn.conn.lift_deadline()  # the run's output stream: bounded by the run's own timeout below
        except ADB_ERRORS as e:
            return ShellRun(None, time.monotonic() - t0, None, gone=self.gone_reason(e))
        pid: int | None = None
        gone: str | None = None
        host_timeout = False
        try:
            sock = conn.conn
            sock.settimeout(0.5)
            deadline = t0 + secs + _HOST_GRACE_S
            while stream.exit_code is None:
                if self.stop.is_set():
                    raise KeyboardInterrupt
                interrupts.check()
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
                    gone = self.gone_reason(e)
                    break
                if not data:
                    gone = self.gone_reason()
                    break
                stream.feed(data)
        except BaseException:  # KeyboardInterrupt: kill the process on the device, then re-raise
            if not self._kill_pidfile(pid, pidfile, budget_s=_STOP_BUDGET_S):
                self._orphans.append(pidfile)  # not reached in time: killed before the next run
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
        tail = "\n".join(stream.stderr_tail)
        if gone is not None:
            self._orphans.append(pidfile)  # its process may still be running there
            return ShellRun(None, wall, pid, gone=gone, stderr_tail=tail)
        code = stream.exit_code
        try:
            self.shell(sh_join(["rm", "-f", pidfile]))
        except DeviceGone as e:
            return ShellRun(code, wall, pid, gone=str(e), stderr_tail=tail)
        # `timeout` exits 124 when it stopped the process, 137 when it had to SIGKILL it after -k 5
        timed_out = host_timeout or (code == 124 and wall >= secs - 1) or (code == 137 and wall >= secs + 4)
        return ShellRun(None if timed_out else code, wall, pid, timed_out=timed_out, stderr_tail=tail)

    def kill(self, pid: int, sig: str = "KILL", timeout: float | None = None) -> bool:
        try:
            code, _, _ = self.shell(sh_join(["kill", f"-{sig}", str(pid)]), timeout=timeout)
        except DeviceGone:
            return False
        return code == 0

    def reap_orphans(self) -> list[str]:
        """Kill processes left running by earlier runs that lost the device, if it answers now; one log
        line per process killed. Runs that still cannot be reached are kept for the next call."""
        notes, left = [], []
        for pidfile in self._orphans:
            try:
                code, out, _ = self.shell(sh_join(["sh", "-c", REAP, "reap", pidfile]), timeout=10.0)
            except DeviceGone:
                left.append(pidfile)
                continue
            pid = out.strip()
            if code == 0 and pid.isdigit():
                notes.append(f"[bmoe-bench] killed engine pid {pid} on the device: an earlier run lost the "
                             "device while it ran, and it was still running")
        self._orphans = left
        return notes

    def _read_pid(self, pidfile: str, timeout: float = 5.0) -> int | None:
        try:
            code, out, _ = self.shell(sh_join(["cat", pidfile]), timeout=timeout)
        except DeviceGone:
            return None
        s = out.strip()
        return int(s) if code == 0 and s.isdigit() else None

    def _kill_pidfile(self, pid: int | None, pidfile: str, budget_s: float | None = None) -> bool:
        """Kill the run's process by PID and remove its pidfile, within budget_s when given (a stop request must
        end the command in seconds, even when the server stalls); whether the process was killed."""
        end = None if budget_s is None else time.monotonic() + budget_s

        def left(default: float) -> float:
            return default if end is None else max(0.1, min(default, end - time.monotonic()))
        pid = pid if pid is not None else self._read_pid(pidfile, left(5.0))
        killed = pid is not None and (end is None or time.monotonic() < end) and self.kill(pid, "KILL", left(30.0))
        if end is None or time.monotonic() < end:
            try:
                self.shell(sh_join(["rm", "-f", pidfile]), timeout=left(5.0))
            except DeviceGone:
                pass
        return killed
