"""LocalTarget against real subprocesses: streaming, logs, exit reasons, timeouts, outputs, Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.errors import UserError
from harness.targets import LocalTarget, RunOutcome, Target
from tests.helpers.sigint import sigint_after

PY = sys.executable


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); count it as dead
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _run(target: LocalTarget, tmp_path: Path, code: str, **kw) -> RunOutcome:
    kw.setdefault("timeout_s", 30)
    kw.setdefault("outputs", [])
    return target.run([PY, "-c", code], out_dir=tmp_path / "out", log_path=tmp_path / "run.log", **kw)


def test_local_target_satisfies_protocol():
    assert isinstance(LocalTarget(), Target)


def test_streams_stdout_lines_and_logs_both_streams(tmp_path):
    lines: list[str] = []
    code = (
        "import sys, time\n"
        "for i in range(3):\n"
        "    print(f'BMOE_PROGRESS {{\"token\": {i}}}', flush=True); time.sleep(0.05)\n"
        "print('warn: something', file=sys.stderr)\n"
    )
    out = _run(LocalTarget(), tmp_path, code, on_stdout_line=lines.append)
    assert out.ok and out.exit_code == 0 and out.reason is None
    assert lines == [f'BMOE_PROGRESS {{"token": {i}}}' for i in range(3)]
    log = (tmp_path / "run.log").read_text()
    assert 'BMOE_PROGRESS {"token": 2}' in log and "warn: something" in log
    assert 0.1 < out.wall_s < 10


def test_nonzero_exit_reason_names_code_and_last_stderr_line(tmp_path):
    out = _run(
        LocalTarget(), tmp_path, "import sys; print('first', file=sys.stderr); sys.exit('model not found')"
    )
    assert not out.ok and out.exit_code == 1
    assert out.reason == "engine exited 1: model not found"


def test_killed_by_signal_reason(tmp_path):
    out = _run(LocalTarget(), tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert out.exit_code is None and out.reason is not None
    assert out.reason.startswith("engine killed by SIGSEGV")


def test_timeout_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen(['sleep', '60']); open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    t0 = time.monotonic()
    out = _run(LocalTarget(), tmp_path, code, timeout_s=1.0)
    assert time.monotonic() - t0 < 8
    assert out.exit_code is None and out.reason == "timeout after 1 s"
    assert "timeout" in (tmp_path / "run.log").read_text()
    gpid = int(pidfile.read_text())
    time.sleep(0.2)
    assert not _alive(gpid), "the engine's child survived the timeout"


def test_outputs_are_fetched_and_a_missing_one_fails_the_run(tmp_path):
    target = LocalTarget()
    rd = Path(target.run_dir())
    try:
        csv = rd / "tokens.csv"
        out = _run(target, tmp_path, f"open({str(csv)!r}, 'w').write('a,b\\n1,2\\n')", outputs=[str(csv)])
        assert out.ok
        assert out.fetched[str(csv)] == tmp_path / "out" / "tokens.csv"
        assert out.fetched[str(csv)].read_text() == "a,b\n1,2\n"

        missing = rd / "never.csv"
        out = _run(target, tmp_path, "pass", outputs=[str(missing)])
        assert not out.ok and out.exit_code == 0
        assert out.reason == f"engine exited 0 but did not write {missing}"
    finally:
        target.close()
    assert not rd.exists()


def test_keyboard_interrupt_kills_engine_and_reraises(tmp_path):
    pidfile = tmp_path / "engine.pid"
    code = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    with sigint_after(1.0), pytest.raises(KeyboardInterrupt):
        _run(LocalTarget(), tmp_path, code, timeout_s=60)
    time.sleep(0.2)
    assert not _alive(int(pidfile.read_text()))


def test_unknown_engine_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no-such-engine"):
        LocalTarget().run(
            ["no-such-engine-xyz"], timeout_s=5, outputs=[], out_dir=tmp_path, log_path=tmp_path / "l"
        )


def test_stage_returns_absolute_path_and_refuses_missing(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert LocalTarget().stage(f, "model") == str(f.resolve())
    with pytest.raises(UserError, match="model"):
        LocalTarget().stage(tmp_path / "nope.gguf", "model")


def test_describe_and_sample_state_have_the_agreed_keys():
    t = LocalTarget()
    d = t.describe()
    assert d["kind"] == "local" and d["cpus"] == os.cpu_count()
    s = t.sample_state()
    for k in (
        "t",
        "mem_available_mib",
        "mem_free_mib",
        "cached_mib",
        "swap_free_mib",
        "thermal",
        "cpu_temp_c",
        "cpufreq",
        "battery",
    ):
        assert k in s
    assert s["mem_available_mib"] > 0  # /proc/meminfo always exists on Linux
    assert abs(s["t"] - time.time()) < 5


def test_killing_an_engine_does_not_hang_on_a_wait_lock_a_ctrl_c_left_held(tmp_path):
    """Popen.wait(timeout) takes its lock before its try/finally; a Ctrl-C between the two leaves it held (a
    runner hung so in CI after SIGINT). The lock held here is that state; the kill must still reap the child."""
    from harness.targets import local

    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    assert proc._waitpid_lock.acquire(False)  # as the interrupted wait(timeout) left it
    done = threading.Event()
    t = threading.Thread(target=lambda: (local._kill_group(proc, None), done.set()), daemon=True)
    t.start()
    try:
        assert done.wait(30), "the kill hung on Popen's wait lock"
        assert proc.returncode == -signal.SIGTERM
    finally:
        if not done.is_set():
            os.kill(proc.pid, signal.SIGKILL)
