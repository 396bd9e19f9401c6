"""Fixtures of the SSH tests: the loopback sshd (tests/helpers/sshd.py) for the session, and one target folder
deployed once per session (the expensive part: a venv with every dependency, copied from the harness's own
environment by `bmoe-bench deploy`)."""

from __future__ import annotations

import time

import pytest

from tests.helpers.sshd import Sshd, base_python, run_cli


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    s = Sshd(tmp_path_factory.mktemp("sshd"))
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def deployed(sshd, tmp_path_factory):
    """(target dir, the first deploy's (exit code, stdout, stderr), its seconds): a fresh folder deployed with the
    harness's base Python."""
    d = tmp_path_factory.mktemp("ssh-target") / "bmoe"
    t = time.monotonic()
    res = run_cli(["deploy", f"root@127.0.0.1:{sshd.port}", "-i", str(sshd.key), "--known-hosts",
                   str(sshd.known_hosts), "--dir", str(d), "--python", base_python()])
    return d, res, time.monotonic() - t
