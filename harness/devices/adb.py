"""Android devices over adbutils, as one `RemoteShell` (harness.devices.remote: the checked push and pull, the
device's reads and a run's process bookkeeping are written there once): this module gives adb's transport (the
shell v2 command, sync push and pull) and runs a process with its exit code. An Android phone, or in tests a real
adbd on loopback. `Device.run` runs

    cd CWD && timeout -k 5 N sh -c 'echo $$ > PIDFILE && exec "$@"' sh ARGV...

over adb's shell v2 protocol (separate stdout/stderr, exit code): the process's own PID is in PIDFILE,
so on Ctrl-C or a host-side timeout it is killed by PID (adb's socket timeout alone leaves it running).
A device that goes away mid-run gives a `ShellRun` whose `gone` says why, not an error. The process may
still be running there (adbd gone, or the USB link): the device remembers it, and before its next run
(or at `reap_orphans`) kills it if the device is back, so a run never shares the device with a leftover
process. The process runs with BMOE_RUN_MARK=PIDFILE in its environment, and only a process carrying
that mark is killed (a PID reused meanwhile is left alone); the run's log says so.

`harness.targets.adb.AdbTarget` builds the campaign runner's Target on this; `bmoe-bench devices` uses
`harness.devices.listing`. The command lines and scripts are in `harness.devices.sh`, the shell v2 decoder in
`harness.devices.adb_stream`, the pure parsers in `harness.devices.parse`.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import TextIO

import adbutils
from adbutils import AdbDevice

from harness import interrupts
from harness.devices.adb_client import ServerClient
from harness.devices.adb_stream import LineCallback, V2Stream
from harness.devices.parse import choose_serial, one_line
from harness.devices.remote import HOST_GRACE_S, STOP_BUDGET_S, RemoteShell, ShellRun
from harness.devices.sh import PID_WRAPPER, sh_join
from harness.devices.timeouts import LIMITS, unbounded
from harness.errors import BmoeError, UserError

# exceptions meaning the adb server or the device connection failed
ADB_ERRORS = (adbutils.AdbError, OSError, EOFError)


class DeviceGone(BmoeError):
    """The device or the adb server stopped answering (one line, exit 1, where no caller turns it into a failed
    run or an unreachable device)."""


class Device(RemoteShell):
    """One adb device, chosen by serial (else $ANDROID_SERIAL, else the only one ready), through the adb
    server at host:port (never one started here: harness.devices.adb_client). `stop` set from another thread ends
    a run in progress as Ctrl-C does (the process killed by PID, KeyboardInterrupt raised in run's thread)."""

    name = "adb device"
    gone = DeviceGone
    away = "adb device"
    copied = "push"
    where = "the device"
    lost = "the device"
    kill_s = 30.0

    def __init__(self, serial: str | None = None, *, host: str = "127.0.0.1", port: int = 5037):
        super().__init__()
        self.client = ServerClient(host=host, port=port)
        self.serial = serial or ""
        self.serial = self.ready(os.environ.get("ANDROID_SERIAL") if serial is None else None)
        self._dev: AdbDevice = self.client.device(serial=self.serial)
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
        else by the command's call bound (harness.devices.timeouts)."""
        try:
            r = self._dev.shell2(cmd, timeout=timeout or LIMITS.call_s, v2=True)
        except ADB_ERRORS as e:
            raise DeviceGone(self.gone_reason(e)) from e
        return r.returncode, r.stdout, r.stderr

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

    # ---- the transport's copies (RemoteShell.push and .pull check them) --------------------------------

    def _send(self, p: Path, part: str, remote: str, kind: str, executable: bool) -> None:
        try:
            with unbounded():  # a large file: bounded by the stall, not by one call's time
                self._dev.sync.push(str(p), part, mode=0o755 if executable else 0o644)
        except ADB_ERRORS as e:
            self.shell(sh_join(["rm", "-f", part]))
            raise UserError(f"{kind} {p.name}: push to {self.serial} failed: {one_line(e)}") from e
        self.shell_ok(sh_join(["mv", "-f", part, remote]), what=f"rename {part}")

    def _fetch(self, remote: str, tmp: Path) -> str | None:
        try:
            with unbounded():
                self._dev.sync.pull(remote, str(tmp))
        except ADB_ERRORS as e:
            raise DeviceGone(self.gone_reason(e)) from e
        return None

    # ---- device-state reads ----------------------------------------------------------------------------

    def describe(self) -> dict:
        """What the device is: build properties (None on a Linux adbd), kernel, CPUs, memory."""
        props = self._described("describe the device")
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
            "cpus": props["cpus"],
            "mem_total_mib": props["mem_total_mib"],
            "fingerprint": props.get("ro.build.fingerprint"),
            "server": self.client.name,
        }

    # ---- processes -------------------------------------------------------------------------------------

    def run(self, argv: list[str], *, cwd: str, timeout_s: float, log: TextIO,
            on_stdout_line: LineCallback | None = None) -> ShellRun:
        """Run argv in cwd on the device, killed after timeout_s; stdout and stderr lines go to log as
        they arrive, stdout lines (without newline) to on_stdout_line, from this thread. An exception
        raised by the callback is re-raised after the run; KeyboardInterrupt kills the process by PID
        and is re-raised. Leftovers of earlier runs that lost the device are reaped first (logged)."""
        for note in self.reap_orphans():
            log.write(note + "\n")
        pidfile = self.new_pidfile(cwd)
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
            deadline = t0 + secs + HOST_GRACE_S
            while stream.exit_code is None:
                if self.stop.is_set():
                    raise KeyboardInterrupt
                interrupts.check()
                if pid is None and time.monotonic() - t0 > 0.2:
                    pid = self.read_pid(pidfile)
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
            if not self.kill_pidfile(pid, pidfile, budget_s=STOP_BUDGET_S):
                self.lose(pidfile)  # not reached in time: killed before the next run
            raise
        finally:
            conn.close()
        wall = time.monotonic() - t0
        stream.flush()
        if pid is None:
            pid = self.read_pid(pidfile)
        if host_timeout:
            self.kill_pidfile(pid, pidfile)
            log.write(f"[bmoe-bench] killed on the device after the {timeout_s:g} s timeout\n")
        if stream.cb_error is not None:
            raise stream.cb_error
        tail = "\n".join(stream.stderr_tail)
        if gone is not None:
            self.lose(pidfile)  # its process may still be running there
            return ShellRun(None, wall, pid, gone=gone, stderr_tail=tail)
        return self.ended(stream.exit_code, wall, pid, pidfile, secs, host_timeout, tail)
