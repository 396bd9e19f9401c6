"""The SSH target against a real sshd on loopback (tests/helpers/sshd.py; the private namespace of
tests/adbd/run-adb-tests.sh, elsewhere these skip): staging by hash, runs streamed and pulled back, device
state, a wrong key in one line, a timeout, and a machine that goes away mid-run."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from harness.devices.ssh import SshAddress
from harness.errors import UserError
from harness.targets.base import Target
from harness.targets.ssh import SshTarget
from tests.helpers.runner import engine

pytestmark = [pytest.mark.ssh]


def address(sshd, key=None) -> SshAddress:
    return SshAddress("127.0.0.1", sshd.port, "root", str(key or sshd.key), str(sshd.known_hosts))


@pytest.fixture
def target(sshd, tmp_path):
    t = SshTarget(address(sshd), dir=str(tmp_path / "there"))
    yield t
    t.close()


def test_ssh_target_describes_itself_and_samples_state(target):
    assert isinstance(target, Target)
    d = target.describe()
    assert d["kind"] == "ssh" and d["port"] == 8022 and d["user"] == "root"
    assert d["cpus"] == os.cpu_count() and d["mem_total_mib"] > 0 and d["kernel"] and d["dir_free_mib"] > 0
    t = time.monotonic()
    s = target.sample_state()
    assert time.monotonic() - t < 2.0
    assert s["mem_available_mib"] > 0 and "error" not in s


def test_stage_copies_once_by_hash_and_again_when_changed(target, tmp_path):
    f = tmp_path / "model.gguf"
    f.write_bytes(os.urandom(100_000))
    remote = target.stage(f, "model")
    assert remote == f"{target.dir}/files/model.gguf" and Path(remote).read_bytes() == f.read_bytes()
    assert target.stage(f, "model") == remote
    f.write_bytes(os.urandom(100_000))
    target.stage(f, "model")
    assert [s for _, s in target.stage_log] == ["pushed", "unchanged", "pushed"]
    assert Path(remote).read_bytes() == f.read_bytes()


def test_run_streams_lines_pulls_outputs_and_reports_failures(target, tmp_path):
    exe = target.stage(engine(tmp_path), "engine")
    lines: list[str] = []
    csv = f"{target.run_dir()}/a.csv"
    out = target.run([exe, "-m", exe, "-n", "3", "--csv", csv, "--progress", "-p", "it's $HOME; `x`"],
                     timeout_s=60, outputs=[csv], out_dir=tmp_path / "o", log_path=tmp_path / "o" / "log",
                     on_stdout_line=lines.append)
    assert out.ok, out.reason
    assert sum(x.startswith("BMOE_PROGRESS") for x in lines) == 3 and out.remote_pid
    assert (tmp_path / "o" / "a.csv").is_file() and not Path(csv).exists()  # pulled, then removed there
    bad = target.run([exe, "-m", exe, "-n", "3", "--csv", csv, "--fail", "3"], timeout_s=60, outputs=[csv],
                     out_dir=tmp_path / "p", log_path=tmp_path / "p" / "log")
    assert not bad.ok and bad.exit_code == 3 and bad.reason.startswith("engine exited 3: ")
    none = target.run(["true"], timeout_s=60, outputs=[csv], out_dir=tmp_path / "q", log_path=tmp_path / "q" / "log")
    assert none.reason == f"engine exited 0 but did not write {csv}"


def test_timeout_kills_the_engine_there(target, tmp_path):
    t = time.monotonic()
    out = target.run(["sh", "-c", "echo started; exec sleep 60"], timeout_s=2, outputs=[], out_dir=tmp_path,
                     log_path=tmp_path / "log")
    assert out.reason == "timeout after 2 s" and time.monotonic() - t < 15
    assert not Path(f"/proc/{out.remote_pid}").exists()


def test_a_wrong_key_is_one_line(sshd, tmp_path):
    with pytest.raises(UserError) as e:
        SshTarget(address(sshd, sshd.wrong_key), dir=str(tmp_path / "x"))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("ssh target root@127.0.0.1:8022: cannot connect: ")
    assert "Permission denied (publickey)" in msg


def test_a_machine_gone_mid_run_fails_that_run_and_its_engine_is_killed_when_it_is_back(sshd, tmp_path):
    t = SshTarget(address(sshd), dir=str(tmp_path / "there"))
    exe = t.stage(engine(tmp_path), "engine")
    hold = tmp_path / "hold"  # never created: the engine waits after its first token
    csv = f"{t.run_dir()}/g.csv"

    def cut() -> None:  # once the run's first token is out, the sshd goes (every sshd process)
        while not any(Path(t.run_dir()).glob(".bmoe-*.pid")):
            time.sleep(0.05)
        time.sleep(1.0)
        sshd.stop()

    killer = threading.Thread(target=cut)
    killer.start()
    try:
        out = t.run([exe, "-m", exe, "-n", "5", "--csv", csv, "--hold", str(hold)], timeout_s=120,
                    outputs=[csv], out_dir=tmp_path / "o", log_path=tmp_path / "o" / "log")
        killer.join()
        assert not out.ok and out.exit_code is None
        assert out.reason.startswith("device gone: root@127.0.0.1:8022: ") and "\n" not in out.reason
        assert Path(f"/proc/{out.remote_pid}").exists()  # still running there, holding
        assert t.sample_state().get("error", "").startswith("device gone: ")
    finally:
        sshd.start()
    again = t.run(["true"], timeout_s=30, outputs=[], out_dir=tmp_path / "p", log_path=tmp_path / "p" / "log")
    assert again.ok, again.reason
    assert f"killed engine pid {out.remote_pid} on the target" in (tmp_path / "p" / "log").read_text()
    for _ in range(50):
        if not Path(f"/proc/{out.remote_pid}").exists():
            break
        time.sleep(0.1)
    assert not Path(f"/proc/{out.remote_pid}").exists()
    t.close()
