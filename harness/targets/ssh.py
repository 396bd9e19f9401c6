"""A machine over SSH as a campaign target (`target: {kind: ssh, host, port, user, identity_file}`), or a
phone's Termux reached through an adb forward (`target: {kind: termux, serial}`, harness.targets.termux).

Transport: OpenSSH's client with one master connection (harness.devices.ssh says why). Measured on loopback here
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
version is not the harness's (harness.deploy.stamp).
"""

from __future__ import annotations

import subprocess
import time
from typing import TextIO

from harness import interrupts
from harness.deploy.stamp import run_refusal
from harness.devices.remote import HOST_GRACE_S, STOP_BUDGET_S, ShellRun
from harness.devices.sh import PID_WRAPPER, sh_join
from harness.devices.ssh import SSH_FAILED, LinkGone, SshAddress, SshLink, expand
from harness.errors import UserError
from harness.targets.base import LineCallback
from harness.targets.local import _Pumps
from harness.targets.remote import RemoteTarget


class SshTarget(RemoteTarget):
    """Runs engines on a machine over SSH. `dir`: its folder there (absolute; default $HOME/bmoe), created
    now. `via`: how it is reached when not directly (a Termux forward: closed with the target)."""

    kind = "ssh"

    def __init__(self, address: SshAddress, *, dir: str | None = None, via: object | None = None):
        self.via = via
        self.link = self.device = SshLink(address)  # `device`: what provenance hashes files through
        self.stage_log: list[tuple[str, str]] = []
        try:
            home = self.link.shell_ok('printf %s "$HOME"', what="read $HOME").strip()
            self.dir = (f"{home}{dir[1:]}" if dir and dir.startswith("~/") else dir or f"{home}/bmoe").rstrip("/")
            if not self.dir.startswith("/"):
                raise UserError(f"ssh target {self.serial}: dir {dir!r} must be an absolute path there")
            self.link.shell_ok(sh_join(["mkdir", "-p", f"{self.dir}/files", self.run_dir()]), what="create its dir")
        except BaseException:
            self.link.close()
            raise

    def describe(self) -> dict:
        a = self.link.address
        free = self.link.free_kib(self.dir)
        return {"kind": "ssh", "host": a.host, "port": a.port, "user": a.user,
                "via": getattr(self.via, "label", None), **self.link.describe(), "dir": self.dir,
                "dir_free_mib": round(free / 1024) if free is not None else None}

    def run_dir(self) -> str:
        return f"{self.dir}/runs"

    def stage_dir(self) -> str:
        return f"{self.dir}/files"

    def bmoe_argv0(self, fix: str) -> list[str]:
        """The deployed `bmoe`, after checking its stamp is the harness's version (UserError naming `fix`)."""
        code, out, _ = self.link.shell(sh_join(["cat", f"{self.dir}/deploy.json"]))
        why = run_refusal(out if code == 0 else None, self.serial, self.dir, fix)
        if why is not None:
            raise UserError(why)
        return [f"{self.dir}/venv/bin/bmoe"]

    def close(self) -> None:
        try:
            self.reap_orphans()
        finally:
            self.link.close()
            if self.via is not None:
                self.via.close()

    # ---- runs ------------------------------------------------------------------------------------------

    def _run_on(self, argv: list[str], timeout_s: float, log: TextIO, on_line: LineCallback | None) -> ShellRun:
        self.link.ensure_master()
        for note in self.reap_orphans():
            log.write(note + "\n")
        return self._run(argv, timeout_s, log, on_line)

    def _run(self, argv: list[str], timeout_s: float, log: TextIO, on_line: LineCallback | None) -> ShellRun:
        pidfile = self.link.new_pidfile(self.run_dir())
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
                    pid = self.link.read_pid(pidfile)
                if time.monotonic() > t0 + secs + HOST_GRACE_S:
                    host_timeout = True
                    break
        except BaseException:  # KeyboardInterrupt: kill the process on the target (within a budget), re-raise
            proc.kill()
            if not self.link.kill_pidfile(pid, pidfile, budget_s=STOP_BUDGET_S):
                self.link.lose(pidfile)  # not reached in time: reaped before the next run
            raise
        if host_timeout:
            self.link.kill_pidfile(pid, pidfile)
            proc.kill()
            code = proc.wait()
            log.write(f"[bmoe-bench] killed on the target after the {timeout_s:g} s timeout\n")
        pumps.join(10.0)
        wall = time.monotonic() - t0
        if pumps.cb_error is not None:
            raise pumps.cb_error
        tail = "\n".join(pumps.stderr_tail)
        if pid is None:
            pid = self.link.read_pid(pidfile)
        if code == SSH_FAILED and not host_timeout:  # the connection failed, or the engine exited 255
            try:
                ec, out, _ = self.link.shell(sh_join(["cat", exitfile]))
            except LinkGone as e:
                self.link.lose(pidfile)
                return ShellRun(None, wall, pid, gone=str(e), stderr_tail=tail)
            if ec != 0 or not out.strip().isdigit():  # no exit file: the process may still be running there
                self.link.lose(pidfile)
                return ShellRun(None, wall, pid, gone=f"{self.serial}: the connection was lost during the run",
                                stderr_tail=tail)
            code = int(out.strip())
        return self.link.ended(code, wall, pid, pidfile, secs, host_timeout, tail)


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
