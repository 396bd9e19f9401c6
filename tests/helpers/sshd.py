"""A real OpenSSH sshd (Debian's openssh-server, installed by .ci/run) on 127.0.0.1:8022, key auth only, for the
tests marked `ssh`. It is started only inside the private network namespace tests/adbd/run-adb-tests.sh makes
(only `lo` there, so nothing outside can reach it), as root; elsewhere those tests skip with WHY_NOT. Port 8022
is Termux's, so the termux target's adb forward (through the loopback adbd) reaches the same sshd.

`Sshd(dir)` writes its host key, a client key pair, authorized_keys and sshd_config into dir; `start()` and
`stop()` may be called again and again (a campaign that loses its target mid-run). `stop()` ends every sshd
process of it, the listener and each connection's, as when the machine's network goes: what runs in a session
(an engine) is left running, as on a phone that dropped off Wi-Fi."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"
PORT = 8022


def why_not() -> str | None:
    """Why the loopback sshd cannot run here (None: it can)."""
    if not os.path.exists(SSHD):
        return "needs Debian's openssh-server (.ci/run installs it)"
    if os.geteuid() != 0:
        return "needs root (sshd)"
    if _interfaces() != ["lo"] or "BMOE_ADB_TEST_SERIAL" not in os.environ:
        return "needs the private network namespace: run tests/adbd/run-adb-tests.sh"
    return None


def _interfaces() -> list[str]:
    """The network interfaces of this process's namespace (/proc/net/dev; /sys shows the mounter's)."""
    lines = Path("/proc/net/dev").read_text().splitlines()[2:]
    return sorted(ln.split(":", 1)[0].strip() for ln in lines if ":" in ln)


WHY_NOT = why_not()


def _ssh_keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bmoe-test", "-f", str(path)], check=True)


class Sshd:
    def __init__(self, d: Path, port: int = PORT):
        self.dir, self.port = Path(d), port
        self.dir.mkdir(parents=True, exist_ok=True)
        self.key = self.dir / "client_key"
        self.wrong_key = self.dir / "wrong_key"
        self.known_hosts = self.dir / "known_hosts"
        for k in (self.dir / "host_key", self.key, self.wrong_key):
            if not k.exists():
                _ssh_keygen(k)
        (self.dir / "authorized_keys").write_text((self.dir / "client_key.pub").read_text())
        self.config = self.dir / "sshd_config"
        self.config.write_text("\n".join([
            f"ListenAddress 127.0.0.1:{port}", f"HostKey {self.dir / 'host_key'}", f"PidFile {self.dir / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.dir / 'authorized_keys'}", "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "UsePAM no", "StrictModes no", "MaxSessions 64", "MaxStartups 64", "LogLevel ERROR", ""]))
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config)], stdin=subprocess.DEVNULL,
                                     stderr=open(self.dir / "sshd.log", "a"), start_new_session=True)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    log = (self.dir / "sshd.log").read_text()
                    raise RuntimeError(f"sshd exited {self.proc.returncode}: {log}") from None
                time.sleep(0.1)
        raise RuntimeError("sshd did not listen within 10 s")

    def stop(self) -> None:
        """SIGKILL the listener and every sshd process under it (each connection's); their sessions' other
        processes are left running."""
        if self.proc is None:
            return
        for pid in [self.proc.pid, *sshd_descendants(self.proc.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        self.proc = None


def _parents() -> dict[int, tuple[int, str]]:
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1: stat.rindex(")")]
            out[int(d)] = (int(stat[stat.rindex(")") + 2:].split()[1]), comm)
    return out


def sshd_descendants(root: int) -> list[int]:
    """The sshd processes below root (an sshd child's own children that are not sshd are not followed)."""
    procs = _parents()
    found, todo = [], [root]
    while todo:
        p = todo.pop()
        for pid, (ppid, comm) in procs.items():
            if ppid == p and comm.startswith("sshd"):
                found.append(pid)
                todo.append(pid)
    return found


def target_yaml(s: Sshd, target_dir: Path, **over: str) -> str:
    """The `target:` of a campaign on the loopback sshd as root, with the test key and known_hosts."""
    keys = {"kind": "ssh", "host": "127.0.0.1", "port": str(s.port), "user": "root", "identity_file": str(s.key),
            "known_hosts": str(s.known_hosts), "dir": str(target_dir), **over}
    return "{" + ", ".join(f"{k}: {v}" for k, v in keys.items() if v is not None) + "}"


def base_python() -> str:
    """The interpreter the harness's venv was made from (the target is this machine)."""
    return str(Path(sys.base_prefix) / "bin" / "python3")


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """`bmoe-bench ARGV` in this process: (exit code, stdout, stderr)."""
    from harness.bench_cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()
