"""Devices that hang (issue 36): an adb server that accepts and never answers made a fleet run silent for 300 s and
SIGTERM took another ~300 s; `devices --server` against a server trickling one byte a second said "no adb devices",
exit 0. Every adb exchange is now bounded (`--device-timeout S`, harness.devices.timeouts), a server that stalls or
trickles is named in one line, and SIGTERM ends the command within 2 s. The servers here are real TCP servers
(tests/helpers/stall_server.py); bmoe-bench is a real process. No adb binary is needed: nothing is ever started."""

from __future__ import annotations

import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers.load import slowdown
from tests.helpers.runner import BENCH, engine
from tests.helpers.stall_server import StallServer, wait_accepted

# what an adb server says to host:devices, one byte a second: a listing that would take over 4 minutes
TRICKLE = b"OKAY00ff" + b"x" * 255


def bench(*args: object, server: StallServer, timeout: float = 300) -> tuple[subprocess.CompletedProcess, float]:
    """bmoe-bench ARGS as a real process, and the seconds from its first connection to the server to its exit (on
    a busy machine the interpreter's start alone can take many seconds: that is not the bound under test)."""
    p = subprocess.Popen([*BENCH, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL)
    try:
        wait_accepted(server, timeout=timeout)
        t0 = time.monotonic()
        out, err = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    return subprocess.CompletedProcess(args, p.returncode, out, err), time.monotonic() - t0


def _no_traceback(r: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr


def test_devices_against_a_trickling_server_names_it_in_one_line():
    with StallServer("trickle", TRICKLE, interval=1.0) as s:
        r, took = bench("devices", "--server", s.address, "--device-timeout", "4", server=s)
    _no_traceback(r)
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = [ln for ln in r.stdout.splitlines() if s.address in ln]
    assert len(lines) == 1 and "trickled" in lines[0] and "no whole answer within 4 s" in lines[0], r.stdout
    assert "no adb devices" not in r.stdout
    assert took < 60


@pytest.mark.parametrize("mode", ["stall", "trickle"])
def test_devices_of_one_server_that_hangs_is_one_error_line(mode):
    with StallServer(mode, TRICKLE, interval=1.0) as s:
        r, took = bench("devices", "--port", s.port, "--device-timeout", "4", server=s)
    _no_traceback(r)
    assert r.returncode == 2, (r.stdout, r.stderr)
    errs = [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errs) == 1 and f"adb server 127.0.0.1:{s.port}" in errs[0], r.stderr
    assert ("stalled: accepted the connection and answered nothing" if mode == "stall" else "trickled") in errs[0]
    assert took < 60


def _fleet(tmp_path: Path, server: str, extra: str = "") -> Path:
    exe = engine(tmp_path)
    model = tmp_path / "model.bin"
    model.write_bytes(b"\0" * 4096)
    p = tmp_path / "fl.yaml"
    p.write_text(textwrap.dedent(f"""\
        name: fl
        model: {{push_from: {model}}}
        engine: {{kind: external, push_from: {exe}}}
        repeats: 1
        tokens: 4
        timeout_s: 60
        cooldown: {{max_wait_s: 5}}
        flags: {{--speed: 10}}
        axes:
          - {{flag: --ms, values: [200]}}
        fleet: {{use: spread, device_grace_s: 300}}
        targets:
          - {{serial: "emulator-5554", server: "{server}", label: a}}
        """) + extra)
    return p


def test_a_fleet_whose_server_never_answers_stops_in_one_line(tmp_path):
    with StallServer("stall") as s:
        p = _fleet(tmp_path, s.address)
        r, took = bench("run", p, "--out", tmp_path / "bd", "--device-timeout", "4", server=s)
    _no_traceback(r)
    assert r.returncode == 2, (r.stdout, r.stderr)
    errs = [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errs) == 1, r.stderr
    assert "no device of the fleet can be used" in errs[0] and f"adb server {s.address} stalled" in errs[0]
    assert took < 60  # not the 300 s of device_grace_s
    assert not (tmp_path / "bd").exists() or not any((tmp_path / "bd").iterdir())


def test_the_campaign_sets_the_device_timeout_and_the_command_overrides_it(tmp_path):
    """`device_timeout_s: 4` in the campaign bounds the stalled server as --device-timeout 4 does (a 2 s stall,
    not the default 15 s); a command's --device-timeout wins over it."""
    with StallServer("stall") as s:
        p = _fleet(tmp_path, s.address, "device_timeout_s: 4\n")
        r, took = bench("run", p, "--out", tmp_path / "bd", server=s)
    _no_traceback(r)
    errs = [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")]
    assert r.returncode == 2 and len(errs) == 1, r.stderr
    assert f"adb server {s.address} stalled: accepted the connection and answered nothing for 2 s" in errs[0], errs
    assert "a campaign's device_timeout_s sets the bound" in errs[0] and took < 60
    with StallServer("stall") as s:
        p = _fleet(tmp_path, s.address, "device_timeout_s: 4\n")
        r, _ = bench("run", p, "--out", tmp_path / "bd2", "--device-timeout", "6", server=s)
    assert "answered nothing for 3 s" in r.stderr, r.stderr


def _sigterm_within_2s(argv: list[object], server: StallServer) -> subprocess.CompletedProcess:
    p = subprocess.Popen([*BENCH, *map(str, argv)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL)
    try:
        wait_accepted(server, timeout=300)  # the command is now waiting on the server
        time.sleep(0.5)
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    r = subprocess.CompletedProcess(argv, p.returncode, out, err)
    _no_traceback(r)
    assert took < 2.0 * slowdown(), (took, err)
    return r


def test_sigterm_while_a_fleet_server_stalls_is_honoured_within_2s(tmp_path):
    """The default bounds (a 30 s call, a 15 s stall): SIGTERM does not wait for them."""
    with StallServer("stall") as s:
        r = _sigterm_within_2s(["run", _fleet(tmp_path, s.address), "--out", tmp_path / "bd"], s)
    assert r.returncode == 130, r.stderr
    errs = [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errs) == 1 and errs[0].startswith("Error: interrupted"), r.stderr


def _ssh_campaign(tmp_path: Path, port: int) -> Path:
    p = tmp_path / "ssh.yaml"
    p.write_text(textwrap.dedent(f"""\
        name: sshstall
        model: {{path: /tmp/m.gguf}}
        target: {{kind: ssh, host: 127.0.0.1, port: {port}, known_hosts: {tmp_path / 'kh'}, dir: {tmp_path / 'd'}}}
        repeats: 1
        tokens: 4
        timeout_s: 60
        axes:
          - {{flag: -t, values: [1]}}
        """))
    return p


def test_an_ssh_target_that_stalls_is_one_line_and_sigterm_is_honoured(tmp_path):
    with StallServer("stall") as s:
        p = _ssh_campaign(tmp_path, s.port)
        r, took = bench("run", p, "--out", tmp_path / "bd", "--device-timeout", "6", server=s)
        _no_traceback(r)
        assert r.returncode == 2, (r.stdout, r.stderr)
        errs = [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")]
        assert len(errs) == 1 and "127.0.0.1" in errs[0] and str(s.port) in errs[0], r.stderr
        assert took < 60
        n = s.accepted
        r = _sigterm_within_2s(["run", p, "--out", tmp_path / "bd"], _After(s, n))
    assert r.returncode in (130, 2), r.stderr


class _After:
    """The server, counting only the connections after the first n."""

    def __init__(self, s: StallServer, n: int):
        self.s, self.n = s, n

    @property
    def accepted(self) -> int:
        return self.s.accepted - self.n
