"""Fixtures of the SSH tests: the loopback sshd (tests/helpers/sshd.py) for the session, and one target folder
deployed once per session (the expensive part: a venv with every dependency, copied from the harness's own
environment by `bmoe-bench deploy`). And of the adb tests: a profiled phone on a real adbd of its own."""

from __future__ import annotations

import itertools
import os
import time

import pytest

from tests.helpers.device_profile import PHONE, DeviceProfile, start_device
from tests.helpers.sshd import Sshd, base_python, run_cli

# the phones' ports: clear of test_adb (15555-15556), the fleet lab (15571-15574), test_fleet_provenance_adb
# (15581-15583), test_device_profile (15601...), test_prepare_adb (15651...), test_held_steady_adb's fleet (15691-15692)
_phone_ports = itertools.count(15701)


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


@pytest.fixture
def phone(tmp_path):
    """A phone (tests/helpers/device_profile.py's PHONE profile) on a real adbd with 256 MiB of /data, room to stage
    an engine and a model; skipped outside tests/adbd/run-adb-tests.sh."""
    if not os.environ.get("BMOE_TEST_ADBD"):
        pytest.skip("needs BMOE_TEST_ADBD (set by tests/adbd/run-adb-tests.sh)")
    dev = start_device(DeviceProfile.create(tmp_path / "phone", PHONE), next(_phone_ports), data_mb=256)
    yield dev
    dev.stop()
