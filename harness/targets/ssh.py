"""A machine over SSH as a campaign target (`target: {kind: ssh, host, port, user, identity_file}`), or a
phone's Termux reached through an adb forward (`target: {kind: termux, serial}`, harness.targets.termux).

Transport: OpenSSH's client with one master connection (harness.sshlink says why). Measured on loopback here
(2026-12-03, 20 `ssh true` each, this shared 2-core machine at load ~8): 0.44-0.67 s a command through the
master against 0.89-1.03 s with a new connection each time (two runs). A campaign sends about two commands a
second while a run goes (the state sample, the PID read until it is known), so the handshake saved matters.

Layout on the target, under `dir` (default ~/bmoe): venv/ and deploy.json (what `bmoe-bench deploy` put
there), files/ (staged models and prompts, copied only when size or sha256 differ), runs/ (run outputs,
pulled into the run's folder and then removed there). A run is

    cd DIR/runs && { timeout -k 5 N sh -c 'echo $$ > PIDFILE && exec "$@"' sh ARGV...; c=$?;
                      echo $c > EXITFILE; exit $c; }

so its PID is known (Ctrl-C and a host-side timeout kill it there), and when the connection is lost the
exit file tells an engine that ended (its exit code stands) from one still running (the run fails
"device gone: ...", and the process is killed before the next run if the machine is back: only a process
carrying the run's mark). The engine `bmoe` is the deployed venv's; a run refuses a target whose deployed
version is not the harness's (harness.deploy_stamp).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import time
from pathlib import Path
from typing import TextIO

from harness import interrupts
from harness.adb import ShellRun
from harness.adb_parse import exit_reason
from harness.adb_shell import PID_WRAPPER, REAP, sh_join
from harness.deploy_stamp import run_refusal
from harness.errors import UserError
from harness.sshlink import SSH_FAILED, LinkGone, SshAddress, SshLink, expand
from harness.targets.base import LineCallback, RunOutcome
from harness.targets.local import _Pumps

_counter = itertools.count()
_STOP_BUDGET_S = 1.5  # Ctrl-C or SIGTERM: the engine's kill on the target gets this long (else reaped later)
_HOST_GRACE_S = 15.0


class SshTarget:
    """Runs engines on a machine over SSH. `dir`: its folder there (absolute; default $HOME/bmoe), created
    now. `via`: how it is reached when not directly (a Termux forward: closed with the target)."""

    kind = "ssh"

    def __init__(self, address: SshAddress, *, dir: str | None = None, via: object | None = None):
        self.via = via
        self.link = self.device = SshLink(address)  # `device`: what provenance hashes files through
        self.stage_log: list[tuple[str, str]] = []
        self._orphans: list[str] = []
        try:
            home = self.link.shell_ok('printf %s "$HOME"', what="read $HOME").strip()
            self.dir = (f"{home}{dir[1:]}" if dir and dir.startswith("~/") else dir or f"{home}/bmoe").rstrip("/")
            if not self.dir.startswith("/"):
                raise UserError(f"ssh target {self.serial}: dir {dir!r} must be an absolute path there")
            self.link.shell_ok(sh_join(["mkdir", "-p", f"{self.dir}/files", self.run_dir()]), what="create its dir")
        except BaseException:
            self.link.close()
            raise

    @property
    def serial(self) -> str:
        return self.link.serial

    def describe(self) -> dict:
        a = self.link.address
        free = self.link.free_kib(self.dir)
        return {"kind": "ssh", "host": a.host, "port": a.port, "user": a.user,
                "via": getattr(self.via, "label", None), **self.link.describe(), "dir": self.dir,
                "dir_free_mib": round(free / 1024) if free is not None else None}

    def run_dir(self) -> str:
        return f"{self.dir}/runs"

    def stage(self, local: Path, kind: str) -> str:
        remote = f"{self.dir}/files/{Path(local).name}"
        self.stage_log.append((remote, self.link.push(Path(local), remote, kind, executable=kind == "engine")))
        return remote

    def bmoe_argv0(self, fix: str) -> list[str]:
        """The deployed `bmoe`, after checking its stamp is the harness's version (UserError naming `fix`)."""
        code, out, _ = self.link.shell(sh_join(["cat", f"{self.dir}/deploy.json"]))
        why = run_refusal(out if code == 0 else None, self.serial, self.dir, fix)
        if why is not None:
            raise UserError(why)
        return [f"{self.dir}/venv/bin/bmoe"]

    def sample_state(self) -> dict:
        return self.link.sample_state()

    def drop_caches(self) -> bool:
        try:
            code, _, _ = self.link.shell("sync && echo 3 > /proc/sys/vm/drop_caches")
        except LinkGone:
            return False
        return code == 0

    def close(self) -> None:
        try:
            self.reap_orphans()
        finally:
            self.link.close()
            if self.via is not None:
                self.via.close()

    # ---- runs ------------------------------------------------------------------------------------------

    def run(self, argv: list[str], *, timeout_s: float, outputs: list[str], out_dir: Path, log_path: Path,
            on_stdout_line: LineCallback | None = None) -> RunOutcome:
        if not argv:
            raise UserError("engine command is empty")
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.link.ensure_master()
        with open(log_path, "w", encoding="utf-8") as log:
            for note in self.reap_orphans():
                log.write(note + "\n")
            sr = self._run(argv, timeout_s, log, on_stdout_line)
        if sr.gone is not None:
            return RunOutcome(sr.exit_code, f"device gone: {sr.gone}", sr.wall_s, remote_pid=sr.pid)
        reason: str | None = None
        if sr.timed_out:
            reason = f"timeout after {timeout_s:g} s"
        elif sr.exit_code is not None and sr.exit_code != 0:
            reason = exit_reason(sr.exit_code, sr.stderr_tail)
        fetched, missing, pull_err = self._pull(outputs, out_dir)
        if reason is None and pull_err:
            reason = f"device gone: {pull_err}"
        elif reason is None and missing:
            reason = f"engine exited 0 but did not write {missing[0]}"
        return RunOutcome(sr.exit_code, reason, sr.wall_s, fetched, remote_pid=sr.pid)

    def _run(self, argv: list[str], timeout_s: float, log: TextIO, on_line: LineCallback | None) -> ShellRun:
        pidfile = f"{self.run_dir()}/.bmoe-{os.getpid()}-{next(_counter)}.pid"
        exitfile = f"{pidfile}.exit"
        secs = max(1, int(round(timeout_s)))
        cmd = (f"{sh_join(['cd', self.run_dir()])} && {{ "
               f"{sh_join(['timeout', '-k', '5', str(secs), 'sh', '-c', PID_WRAPPER, pidfile, *argv])}; "
               f"c=$?; echo $c > {sh_join([exitfile])}; exit $c; }}")
        t0 = time.monotonic()
        proc = subprocess.Popen(self.link.argv(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        pumps = _Pumps(proc, log, on_line)
        pid: int | None = None
        host_timeout = False
        try:
            while True:
                try:
                    code = proc.wait(0.5)
                    break
                except subprocess.TimeoutExpired:
                    interrupts.check()
                if pid is None:
                    pid = self._read_pid(pidfile)
                if time.monotonic() > t0 + secs + _HOST_GRACE_S:
                    host_timeout = True
                    break
        except BaseException:  # KeyboardInterrupt: kill the process on the target (within a budget), re-raise
            proc.kill()
            if not self._kill_pidfile(pid, pidfile, budget_s=_STOP_BUDGET_S):
                self._orphans.append(pidfile)  # not reached in time: reaped before the next run
            raise
        if host_timeout:
            self._kill_pidfile(pid, pidfile)
            proc.kill()
            code = proc.wait()
            log.write(f"[bmoe-bench] killed on the target after the {timeout_s:g} s timeout\n")
        pumps.join(10.0)
        wall = time.monotonic() - t0
        if pumps.cb_error is not None:
            raise pumps.cb_error
        tail = "\n".join(pumps.stderr_tail)
        if pid is None:
            pid = self._read_pid(pidfile)
        if code == SSH_FAILED and not host_timeout:  # the connection failed, or the engine exited 255
            try:
                ec, out, _ = self.link.shell(sh_join(["cat", exitfile]), timeout=20.0)
            except LinkGone as e:
                self._orphans.append(pidfile)
                return ShellRun(None, wall, pid, gone=str(e), stderr_tail=tail)
            if ec != 0 or not out.strip().isdigit():  # no exit file: the process may still be running there
                self._orphans.append(pidfile)
                return ShellRun(None, wall, pid, gone=f"{self.serial}: the connection was lost during the run",
                                stderr_tail=tail)
            code = int(out.strip())
        try:
            self.link.shell(sh_join(["rm", "-f", pidfile, exitfile]))
        except LinkGone as e:
            return ShellRun(code, wall, pid, gone=str(e), stderr_tail=tail)
        timed_out = host_timeout or (code == 124 and wall >= secs - 1) or (code == 137 and wall >= secs + 4)
        return ShellRun(None if timed_out else code, wall, pid, timed_out=timed_out, stderr_tail=tail)

    def _pull(self, outputs: list[str], out_dir: Path) -> tuple[dict[str, Path], list[str], str | None]:
        """Pull each output into out_dir (size-checked); outputs inside run_dir() are then removed there."""
        fetched: dict[str, Path] = {}
        missing: list[str] = []
        for remote in outputs:
            path = remote if remote.startswith("/") else f"{self.run_dir()}/{remote}"
            dest = out_dir / Path(path).name
            try:
                if not self.link.pull(path, dest):
                    missing.append(remote)
                    continue
                if path.startswith(self.run_dir() + "/"):
                    self.link.shell(sh_join(["rm", "-f", path]))
            except LinkGone as e:
                return fetched, missing, str(e)
            fetched[remote] = dest
        return fetched, missing, None

    def reap_orphans(self) -> list[str]:
        """Kill processes left running by runs that lost the connection, if the machine answers now."""
        notes, left = [], []
        for pidfile in self._orphans:
            try:
                code, out, _ = self.link.shell(sh_join(["sh", "-c", REAP, "reap", pidfile]), timeout=10.0)
                self.link.shell(sh_join(["rm", "-f", f"{pidfile}.exit"]), timeout=10.0)
            except LinkGone:
                left.append(pidfile)
                continue
            if code == 0 and out.strip().isdigit():
                notes.append(f"[bmoe-bench] killed engine pid {out.strip()} on the target: an earlier run lost the "
                             "connection while it ran, and it was still running")
        self._orphans = left
        return notes

    def _read_pid(self, pidfile: str, timeout: float = 5.0) -> int | None:
        try:
            code, out, _ = self.link.shell(sh_join(["cat", pidfile]), timeout=timeout)
        except LinkGone:
            return None
        s = out.strip()
        return int(s) if code == 0 and s.isdigit() else None

    def _kill_pidfile(self, pid: int | None, pidfile: str, budget_s: float | None = None) -> bool:
        """Kill the run's process by PID and remove its files, within budget_s when given (a stop request ends the
        command in seconds even over a hung link); whether it was killed."""
        end = None if budget_s is None else time.monotonic() + budget_s

        def left(default: float) -> float:
            return default if end is None else max(0.1, min(default, end - time.monotonic()))
        killed = False
        try:
            pid = pid if pid is not None else self._read_pid(pidfile, left(5.0))
            if pid is not None and (end is None or time.monotonic() < end):
                killed = self.link.shell(sh_join(["kill", "-KILL", str(pid)]), timeout=left(5.0))[0] == 0
            if end is None or time.monotonic() < end:
                self.link.shell(sh_join(["rm", "-f", pidfile, f"{pidfile}.exit"]), timeout=left(5.0))
        except LinkGone:
            pass
        return killed


def ssh_target(spec) -> SshTarget:
    """The target a campaign's `target:` (harness.formats.campaign.TargetSpec, kind ssh or termux) names."""
    if spec.kind == "termux":
        from harness.targets.termux import TermuxForward

        fwd = TermuxForward(spec.serial, spec.port)
        try:
            return SshTarget(fwd.address(spec.user, spec.identity_file, spec.known_hosts), dir=spec.dir, via=fwd)
        except BaseException:
            fwd.close()
            raise
    return SshTarget(address_of(spec), dir=spec.dir)


def address_of(spec) -> SshAddress:
    return SshAddress(host=str(spec.host), port=spec.port or 22, user=spec.user,
                      identity_file=expand(spec.identity_file), known_hosts=expand(spec.known_hosts))
