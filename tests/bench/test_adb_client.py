"""An adb server that does not answer is an error naming it, and never replaced by one started here (adbutils'
own AdbClient runs `adb start-server` when a connection fails: at $ANDROID_ADB_SERVER_PORT, so this test points
that at the port it asks for, where such a server would then answer); and bmoe never forwards a port (adbutils'
forward_port picks a port free here although the forward opens on the server's host)."""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path

import adbutils
import pytest

from harness.devices.adb_client import ServerClient, ServerUnreachable, list_server

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def test_an_unreachable_server_is_named_and_no_server_is_started(monkeypatch):
    port = _free_port()
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(port))
    try:
        with pytest.raises(ServerUnreachable, match=rf"^adb server 127\.0\.0\.1:{port} unreachable \(.*\); is "
                                                    rf"`adb -a -P {port} server nodaemon` running there\?$"):
            ServerClient("127.0.0.1", port).list()
        with pytest.raises(ServerUnreachable, match=rf"adb server 127\.0\.0\.1:{port} unreachable"):
            list_server("127.0.0.1", port)
        assert not _listening(port), "a local adb server was started in place of the unreachable one"
    finally:  # should the test fail that way, stop the server it started
        subprocess.run([adbutils.adb_path(), "-P", str(port), "kill-server"], capture_output=True, timeout=20)


def test_nothing_in_the_harness_forwards_a_port():
    calls = re.compile(r"\.forward(_port|_list)?\(|\.reverse\([^)]")  # a list's .reverse() is no adb call
    users = [str(p.relative_to(REPO)) for p in (REPO / "harness").rglob("*.py") if calls.search(p.read_text())]
    # the one exception: a Termux target forwards through the harness machine's own adb server (its serial, no
    # server key), where forward_port's free local port is on the right host
    assert users == ["harness/targets/termux.py"]
