"""A machine reached over SSH, through OpenSSH's own `ssh` client: commands with exit codes, files copied
in (size and sha256 checked, only when they differ) and out (size-checked), and device-state reads.

Why the OpenSSH client and not a Python SSH library: it is on every machine that has SSH (Termux's
`openssh` package included), it reads the user's ~/.ssh/config, keys and agent as any `ssh` does, it
adds no dependency, and with ControlMaster one authenticated connection carries every command of a
campaign: a command costs a new channel, not a new handshake (measured on loopback here: see
harness.targets.ssh). A library (paramiko, asyncssh) would need its own key and host-key handling and a
dependency on the target side of nothing more.

`SshLink(address)` starts the master connection at once (`ssh -M -N -f`, in its own session so Ctrl-C
does not end it); a wrong key, a refused port or an unknown host is one `UserError` line then. Every
later command goes through the master's socket. It is one `RemoteShell` (harness.devices.remote: the checked
copies, the machine's reads and a run's process bookkeeping are written there once); this module gives the
transport: a command, a copy in through `cat`, a copy out. Commands are built by `sh_join` (every word quoted), so
a path or a prompt from a campaign is never read as shell; the remote login shell must be POSIX
(bash, dash, zsh, Termux's bash). When the machine stops answering (ssh's own exit 255, or no answer in
time) a command raises `LinkGone` with ssh's last line as the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.devices.parse import last_line
from harness.devices.remote import HASH_TIMEOUT_S, RemoteShell
from harness.devices.sh import sh_join
from harness.devices.timeouts import BOUND, LIMITS
from harness.errors import ResourceError, UserError

SSH_FAILED = 255  # ssh's own exit code when the connection (not the command) failed


class LinkGone(ResourceError):
    """The SSH machine stopped answering. Inside a run it is the run's reason ("device gone: ..."); between
    runs (the model's hash before the next one) it stops the campaign with this line, the folder resumable."""


@dataclass(frozen=True)
class SshAddress:
    host: str
    port: int = 22
    user: str | None = None
    identity_file: str | None = None
    known_hosts: str | None = None  # a known_hosts file of its own (default: ssh's ~/.ssh/known_hosts)
    host_key_alias: str | None = None  # the name its host key is kept under (Termux: the phone, not the port)

    def label(self) -> str:
        return f"{self.user + '@' if self.user else ''}{self.host}:{self.port}"


def ssh_options(a: SshAddress) -> list[str]:
    """The options of every ssh call: no prompts (keys only), host keys trusted on first use and checked
    after, a dead link noticed within ~15 s."""
    stall = max(1, round(LIMITS.stall_s))  # the command's bound (harness.devices.timeouts): connect, then keep-alive
    opts = ["-p", str(a.port), "-o", "BatchMode=yes", "-o", f"ConnectTimeout={stall}",
            "-o", f"ServerAliveInterval={max(1, stall // 3)}", "-o", "ServerAliveCountMax=3",
            "-o", "StrictHostKeyChecking=accept-new", "-o", "LogLevel=ERROR"]
    if a.identity_file:
        opts += ["-i", a.identity_file, "-o", "IdentitiesOnly=yes"]
    if a.known_hosts:
        opts += ["-o", f"UserKnownHostsFile={a.known_hosts}"]
    if a.host_key_alias:
        opts += ["-o", f"HostKeyAlias={a.host_key_alias}"]
    if a.user:
        opts += ["-l", a.user]
    return opts


def expand(p: str | None) -> str | None:
    """A path from a campaign or the command line with ~ expanded (None stays None)."""
    return str(Path(p).expanduser()) if p else None


class SshLink(RemoteShell):
    """One SSH machine, through a master connection opened now (UserError if it cannot be)."""

    name = "ssh target"
    gone = LinkGone
    away = "the ssh target"
    copied = "copy"
    where = "the target"
    lost = "the connection"
    kill_s = 5.0
    exit_files = True  # a run leaves PIDFILE.exit: its exit code, read when the connection was lost

    def __init__(self, address: SshAddress):
        super().__init__()
        self.address = address
        self.serial = address.label()  # names the machine in messages and in the hash cache
        if shutil.which("ssh") is None:
            raise UserError("ssh target: the OpenSSH client `ssh` is not installed here (apt-get install "
                            "openssh-client)")
        if address.identity_file and not Path(address.identity_file).expanduser().is_file():
            raise UserError(f"ssh target {self.serial}: identity_file {address.identity_file} does not exist")
        self._dir = tempfile.mkdtemp(prefix=f"bmoe-ssh-{os.getpid()}-", dir="/tmp")  # a short socket path
        self.socket = f"{self._dir}/m"
        try:
            self.open()
        except BaseException:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise

    def argv(self, cmd: str | None = None, *, master: bool = False) -> list[str]:
        """The ssh command line running cmd (an already-quoted command line) through the master."""
        a = ["ssh", *ssh_options(self.address), "-S", self.socket]
        if master:
            return [*a, "-M", "-N", "-f", "-o", "ControlPersist=300", self.address.host]
        return [*a, "-o", "ControlMaster=no", self.address.host, *([cmd] if cmd is not None else [])]

    def open(self) -> None:
        """Start the master connection (again, after a lost link); UserError with ssh's reason if it fails."""
        err = Path(self._dir) / "master.err"
        with open(err, "w") as ef:
            try:
                p = subprocess.run(self.argv(master=True), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=ef, timeout=LIMITS.call_s, start_new_session=True)
            except subprocess.TimeoutExpired:
                raise UserError(f"ssh target {self.serial}: no answer in {LIMITS.call_s:g} s; is the host up, and "
                                f"is it an sshd? ({BOUND})") from None
        if p.returncode != 0:
            why = last_line(err.read_text(errors="replace")) or f"ssh exited {p.returncode}"
            raise UserError(f"ssh target {self.serial}: cannot connect: {why}"
                            + (" (check identity_file and the target's authorized_keys)" if "denied" in why else ""))

    def _control(self, op: str) -> bool:
        """`ssh -O op` to the master (check, exit): True if it answered."""
        try:
            p = subprocess.run(["ssh", "-S", self.socket, "-O", op, self.address.host], stdin=subprocess.DEVNULL,
                               capture_output=True, timeout=10)
        except subprocess.TimeoutExpired:
            return False
        return p.returncode == 0

    def ensure_master(self) -> None:
        """Start the master again if it died (a lost link that came back); without one, commands connect
        on their own, only slower."""
        if not self._control("check"):
            try:
                self.open()
            except UserError:
                pass  # the run that follows fails with the reason

    def close(self) -> None:
        self._control("exit")
        shutil.rmtree(self._dir, ignore_errors=True)

    # ---- commands --------------------------------------------------------------------------------------

    def shell(self, cmd: str, timeout: float | None = None, stdin=None) -> tuple[int, str, str]:
        """Run one already-quoted command line; (exit code, stdout, stderr). Raises LinkGone. Bounded by timeout,
        else by the command's call bound (harness.devices.timeouts)."""
        timeout = timeout or LIMITS.call_s
        try:
            p = subprocess.run(self.argv(cmd), stdin=stdin if stdin is not None else subprocess.DEVNULL,
                               capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise LinkGone(f"{self.serial}: no answer in {timeout:g} s") from None
        out, err = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
        if p.returncode == SSH_FAILED:
            raise LinkGone(f"{self.serial}: {last_line(err) or 'connection lost'}")
        return p.returncode, out, err

    # ---- reads -----------------------------------------------------------------------------------------

    def describe(self) -> dict:
        """What the machine is: kernel, CPUs, memory, and Android's build properties where getprop answers
        (Termux)."""
        props = self._described("describe the machine")
        return {"kernel": props.get("uname"), "hardware": props.get("hardware"),
                "cpus": props["cpus"], "mem_total_mib": props["mem_total_mib"],
                "model": " ".join(x for x in (props.get("ro.product.manufacturer"), props.get("ro.product.model"))
                                  if x) or None,
                "android_release": props.get("ro.build.version.release"),
                "platform": props.get("ro.board.platform") or props.get("ro.soc.model"),
                "abi": props.get("ro.product.cpu.abi")}

    # ---- the transport's copies (RemoteShell.push and .pull check them) --------------------------------

    def _send(self, p: Path, part: str, remote: str, kind: str, executable: bool) -> None:
        with open(p, "rb") as f:
            code, _, err = self.shell(" ".join([sh_join(["cat"]), ">", sh_join([part]), "&&",
                                                sh_join(["chmod", "755" if executable else "644", part]), "&&",
                                                sh_join(["mv", "-f", part, remote])]),
                                      timeout=HASH_TIMEOUT_S, stdin=f)
        if code != 0:
            raise UserError(f"{kind} {p.name}: copy to {self.serial} failed: {last_line(err) or f'exit {code}'}")

    def _fetch(self, remote: str, tmp: Path) -> str | None:
        with open(tmp, "wb") as f:
            try:
                p = subprocess.run(self.argv(sh_join(["cat", remote])), stdin=subprocess.DEVNULL, stdout=f,
                                   stderr=subprocess.PIPE, timeout=HASH_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise LinkGone(f"{self.serial}: pull of {remote} timed out") from None
        return f", {last_line(p.stderr.decode(errors='replace'))}" if p.returncode else None
