"""One remote shell that adb and SSH both implement (`RemoteShell`): a transport gives `shell` (one command line,
its exit code and output), `_send` (a local file copied to a temporary path there and renamed into place) and
`_fetch` (a file copied back); everything else is written once, here, over those three:

- a command that must succeed (`shell_ok`) and the device's reads: its description's properties, a device-state
  sample (harness.devices.state), a file's size and sha256, free space, a page-cache drop (root only);
- the checked copies: `push` copies a file only when its size or sha256 there differs, after a free-space check,
  and verifies it after; `pull` copies a file back, size-checked;
- a run's process on the device: its PID read from its pidfile, killed by PID (within a budget on a stop
  request), and a run that lost the device while its process ran kept as an orphan, killed before the next run
  if the device is back (`reap_orphans`: only a process carrying the run's mark, harness.devices.sh.REAP).

Every command is built by `sh_join` (every word quoted), so a path or a prompt from a campaign is never read as
shell. When the device stops answering, `shell` raises the transport's `gone` kind (adb: DeviceGone, SSH: LinkGone).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from harness.devices import state as devstate
from harness.devices.parse import file_sha256, last_line, parse_df_available_kib, parse_sha256
from harness.devices.sh import DESCRIBE_SCRIPT, REAP, SHA256_SCRIPT, script, sh_join
from harness.errors import UserError

SPACE_MARGIN_KIB = 64 * 1024  # keep this much free on the device after a push
HASH_TIMEOUT_S = 3600.0  # sha256 of a 60 GB model on a phone takes a few minutes
HOST_GRACE_S = 15.0  # a run's host-side deadline beyond the device-side `timeout`
STOP_BUDGET_S = 1.5  # Ctrl-C or SIGTERM: the engine's kill on the device gets this long (else reaped later)
_counter = itertools.count()
_local_hashes: dict[tuple[str, int, int], str] = {}  # a local file's sha256, shared by every device (a fleet
_hash_lock = threading.Lock()  # pushes one model to each device: hashed once, not once per device)


@dataclass
class ShellRun:
    """One process run on a device (adb: `Device.run`; SSH: `SshTarget`)."""

    exit_code: int | None  # None when no exit code came back (device gone, timed out)
    wall_s: float  # from the start of the command to its end, measured on the host
    pid: int | None  # the process's PID on the device, if it was read
    gone: str | None = None  # why the device stopped answering mid-run, if it did
    timed_out: bool = False  # killed after timeout_s (on the device, or from the host)
    stderr_tail: str = ""  # the last stderr lines, for a one-line reason


def local_sha256(p: Path) -> str:
    """A local file's sha256, computed once per (path, size, mtime) in this process."""
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    with _hash_lock:
        if key not in _local_hashes:
            _local_hashes[key] = file_sha256(p)
        return _local_hashes[key]


class RemoteShell(ABC):
    """A device reached through a shell. Subclasses set the words their messages use and give the transport."""

    serial: str  # names the device in messages
    name: ClassVar[str]  # the kind, as messages start: "adb device", "ssh target"
    gone: ClassVar[type[Exception]]  # what `shell` raises when the device stops answering
    away: ClassVar[str]  # what went away while staging: "adb device", "the ssh target"
    copied: ClassVar[str]  # the copy's name in a mismatch: "push", "copy"
    where: ClassVar[str]  # where a reaped process ran: "the device", "the target"
    lost: ClassVar[str]  # what an earlier run lost: "the device", "the connection"
    kill_s: ClassVar[float]  # the bound of one kill command
    exit_files: ClassVar[bool] = False  # a run leaves PIDFILE.exit beside its pidfile (SSH)

    def __init__(self) -> None:
        self._orphans: list[str] = []  # pidfiles of runs that lost the device while their process ran

    # ---- the transport -----------------------------------------------------------------------------------

    @abstractmethod
    def shell(self, cmd: str, timeout: float | None = None) -> tuple[int, str, str]:
        """Run one already-quoted command line; (exit code, stdout, stderr). Raises `gone`."""

    @abstractmethod
    def _send(self, p: Path, part: str, remote: str, kind: str, executable: bool) -> None:
        """Copy p to part, then rename it to remote; UserError when the copy fails, `gone` when the device does."""

    @abstractmethod
    def _fetch(self, remote: str, tmp: Path) -> str | None:
        """Copy remote into tmp: None when the copy ended well, else what to add to the "incomplete" line."""

    # ---- commands and reads ------------------------------------------------------------------------------

    def shell_ok(self, cmd: str, what: str, timeout: float | None = None) -> str:
        """stdout of a command that must succeed; UserError "cannot <what>: ..." otherwise."""
        try:
            code, out, err = self.shell(cmd, timeout)
        except self.gone as e:
            raise UserError(f"{self.name} {self.serial}: cannot {what}: {e}") from e
        if code != 0:
            raise UserError(f"{self.name} {self.serial}: cannot {what}: {last_line(err or out) or f'exit {code}'}")
        return out

    def _described(self, what: str) -> dict:
        """The description script's answers (build properties None where getprop is absent), with "cpus" a number
        and "mem_total_mib" from /proc/meminfo."""
        out = self.shell_ok(script(DESCRIBE_SCRIPT), what=what)
        kv = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        props = {k: (v.strip() or None) for k, v in kv.items()}
        mem = devstate.parse_meminfo(self.shell(sh_join(["cat", "/proc/meminfo"]))[1])
        cpus = props.get("cpus")
        return {**props, "cpus": int(cpus) if cpus and cpus.isdigit() else None, "mem_total_mib": mem["mem_total_mib"]}

    def sample_state(self) -> dict:
        """One device-state sample in one shell round trip. If the device is gone, the sample has no
        readings (None/empty) and an "error" key with the reason."""
        t = time.time()
        try:
            _, out, _ = self.shell(script(devstate.STATE_SCRIPT))  # bounded by the command's or campaign's limit
        except self.gone as e:
            s = devstate.parse_state_dump("", t=t)
            s["error"] = f"device gone: {e}"
            return s
        return devstate.parse_state_dump(out, t=t)

    def drop_caches(self) -> bool:
        """Drop the device's page cache: only possible as root; False otherwise."""
        try:
            code, _, _ = self.shell("sync && echo 3 > /proc/sys/vm/drop_caches")
        except self.gone:
            return False
        return code == 0

    def remote_size(self, path: str) -> int | None:
        code, out, _ = self.shell(sh_join(["stat", "-c", "%s", path]))
        s = out.strip()
        return int(s) if code == 0 and s.isdigit() else None

    def remote_sha256(self, path: str) -> str | None:
        code, out, err = self.shell(script(SHA256_SCRIPT, path), timeout=HASH_TIMEOUT_S)
        if code == 127:
            raise UserError(f"{self.name} {self.serial}: {last_line(err)}")
        return parse_sha256(out) if code == 0 else None

    def free_kib(self, path: str) -> int | None:
        code, out, _ = self.shell(sh_join(["df", "-Pk", path]))
        return parse_df_available_kib(out) if code == 0 else None

    # ---- files -------------------------------------------------------------------------------------------

    def push(self, local: Path, remote: str, kind: str, *, executable: bool = False) -> str:
        """Copy local to the path remote unless a file of the same size and sha256 is there already: "unchanged"
        or "pushed". Checks free space first (with a margin), writes remote.part then renames it, and verifies
        size and sha256 after. kind names the file in errors."""
        p = Path(local)
        if not p.is_file():
            raise UserError(f"{kind}: {p} does not exist or is not a file")
        size, want = p.stat().st_size, local_sha256(p)
        parent = remote.rsplit("/", 1)[0] or "/"
        try:
            have = self.remote_size(remote)
            if have == size and self.remote_sha256(remote) == want:
                return "unchanged"
            free = self.free_kib(parent)
            need = -(-size // 1024) + SPACE_MARGIN_KIB - (have or 0) // 1024
            if free is None:
                raise UserError(f"{self.name} {self.serial}: cannot read free space of {parent} (df)")
            if free < need:
                raise UserError(f"{kind} {p.name}: needs {need / 1024:.0f} MiB free in {parent} on {self.serial} "
                                f"(including a {SPACE_MARGIN_KIB // 1024} MiB margin), only {free / 1024:.0f} MiB free")
            self._send(p, f"{remote}.part", remote, kind, executable or os.access(p, os.X_OK))
            got_size, got_hash = self.remote_size(remote), self.remote_sha256(remote)
        except self.gone as e:
            raise UserError(f"{kind} {p.name}: {self.away} went away while staging: {e}") from e
        if got_size != size or got_hash != want:
            raise UserError(f"{kind} {p.name}: on {self.serial} after the {self.copied} it has size {got_size} and "
                            f"sha256 {got_hash}, expected {size} and {want}")
        return "pushed"

    def pull(self, remote: str, dest: Path) -> bool:
        """Copy remote to dest (through dest.part, size-checked). False if there is no such file there; `gone` if
        the device stops answering or the copy comes up short."""
        size = self.remote_size(remote)
        if size is None:
            return False
        tmp = dest.with_name(dest.name + ".part")
        failed = self._fetch(remote, tmp)
        got = tmp.stat().st_size
        if failed is not None or got != size:
            raise self.gone(f"{self.serial}: pull of {remote} incomplete ({got} of {size} bytes{failed or ''})")
        tmp.replace(dest)
        return True

    # ---- a run's process ---------------------------------------------------------------------------------

    @staticmethod
    def new_pidfile(run_dir: str) -> str:
        """A pidfile name of its own for the next run in run_dir."""
        return f"{run_dir}/.bmoe-{os.getpid()}-{next(_counter)}.pid"

    def _run_files(self, pidfile: str) -> list[str]:
        return [pidfile, f"{pidfile}.exit"] if self.exit_files else [pidfile]

    def read_pid(self, pidfile: str, timeout: float = 5.0) -> int | None:
        try:
            code, out, _ = self.shell(sh_join(["cat", pidfile]), timeout=timeout)
        except self.gone:
            return None
        s = out.strip()
        return int(s) if code == 0 and s.isdigit() else None

    def kill(self, pid: int, sig: str = "KILL", timeout: float | None = None) -> bool:
        try:
            code, _, _ = self.shell(sh_join(["kill", f"-{sig}", str(pid)]), timeout=timeout)
        except self.gone:
            return False
        return code == 0

    def kill_pidfile(self, pid: int | None, pidfile: str, budget_s: float | None = None) -> bool:
        """Kill the run's process by PID and remove its files, within budget_s when given (a stop request must end
        the command in seconds, even over a stalled link); whether the process was killed."""
        end = None if budget_s is None else time.monotonic() + budget_s

        def left(default: float) -> float:
            return default if end is None else max(0.1, min(default, end - time.monotonic()))
        pid = pid if pid is not None else self.read_pid(pidfile, left(5.0))
        in_time = end is None or time.monotonic() < end
        killed = pid is not None and in_time and self.kill(pid, "KILL", left(self.kill_s))
        if end is None or time.monotonic() < end:
            try:
                self.shell(sh_join(["rm", "-f", *self._run_files(pidfile)]), timeout=left(5.0))
            except self.gone:
                pass
        return killed

    def lose(self, pidfile: str) -> None:
        """The run of pidfile lost the device while its process may still run: reap it before the next run."""
        self._orphans.append(pidfile)

    def reap_orphans(self) -> list[str]:
        """Kill processes left running by earlier runs that lost the device, if it answers now; one log line per
        process killed. Runs that still cannot be reached are kept for the next call."""
        notes, left = [], []
        for pidfile in self._orphans:
            try:
                code, out, _ = self.shell(sh_join(["sh", "-c", REAP, "reap", pidfile]))
                if self.exit_files:
                    self.shell(sh_join(["rm", "-f", f"{pidfile}.exit"]))
            except self.gone:
                left.append(pidfile)
                continue
            pid = out.strip()
            if code == 0 and pid.isdigit():
                notes.append(f"[bmoe-bench] killed engine pid {pid} on {self.where}: an earlier run lost {self.lost} "
                             "while it ran, and it was still running")
        self._orphans = left
        return notes

    def ended(self, code: int | None, wall: float, pid: int | None, pidfile: str, secs: int, host_timeout: bool,
              tail: str) -> ShellRun:
        """The ShellRun of a run that ended with exit code `code`, once its files are removed from the device."""
        try:
            self.shell(sh_join(["rm", "-f", *self._run_files(pidfile)]))
        except self.gone as e:
            return ShellRun(code, wall, pid, gone=str(e), stderr_tail=tail)
        # `timeout` exits 124 when it stopped the process, 137 when it had to SIGKILL it after -k 5
        timed_out = host_timeout or (code == 124 and wall >= secs - 1) or (code == 137 and wall >= secs + 4)
        return ShellRun(None if timed_out else code, wall, pid, timed_out=timed_out, stderr_tail=tail)
