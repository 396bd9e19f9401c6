"""AdbTarget against a real adbd on loopback (tests/adbd/run-adb-tests.sh runs these inside a private
network namespace; anywhere else they skip). The "device" is this machine's Linux seen through adbd:
its shell is dash, /data/local/tmp is a tmpfs private to the namespace, there is no getprop/dumpsys."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from harness.devices.sh import sh_join
from harness.errors import UserError
from harness.targets import Target
from harness.targets.adb import AdbTarget
from tests.helpers.adbd import SERIAL
from tests.helpers.sigint import sigint_after

pytestmark = [
    pytest.mark.adb,
]

# An engine for the device: a POSIX sh script. Its argv goes to args.bin (NUL-separated) so the test can
# compare it byte for byte; then progress lines, a CSV in its cwd (the run dir), an exit code from $1.
ENGINE = r"""#!/bin/sh
printf '%s\0' "$@" > args.bin
echo "engine pid $$"
i=0
while [ "$i" -lt "${STEPS:-3}" ]; do
  i=$((i + 1)); echo "BMOE_PROGRESS {\"token\": $i}"; sleep "${DELAY:-0.05}"
done
printf 'token,wall_s\n1,0.1\n' > tokens.csv
echo "a warning" >&2
[ "$1" = fail ] && { echo "fatal: model file is truncated" >&2; exit 3; }
[ "$1" = sleep ] && exec sleep "$2"
[ "$1" = spin ] && while :; do sleep 0.2; done
exit 0
"""


@pytest.fixture(scope="module")
def target() -> AdbTarget:
    t = AdbTarget(SERIAL)
    yield t
    t.close()


@pytest.fixture(scope="module")
def engine(target: AdbTarget, tmp_path_factory) -> str:
    p = tmp_path_factory.mktemp("eng") / "fake-engine.sh"
    p.write_text(ENGINE)
    p.chmod(0o755)
    return target.stage(p, "engine")


def _run(t: AdbTarget, argv: list[str], tmp: Path, **kw):
    kw.setdefault("timeout_s", 30)
    kw.setdefault("outputs", [])
    return t.run(argv, out_dir=tmp / "out", log_path=tmp / "run.log", **kw)


def _remote_alive(t: AdbTarget, pid: int) -> bool:
    code, out, _ = t.device.shell(f"kill -0 {pid} 2>/dev/null && ! grep -q '^State:.*Z' /proc/{pid}/status")
    return code == 0


def test_adb_target_satisfies_protocol(target):
    assert isinstance(target, Target) and target.kind == "adb"


def test_describe_a_linux_adbd(target):
    d = target.describe()
    assert d["serial"] == SERIAL and d["kind"] == "adb"
    assert d["model"] is None  # no getprop on a Linux adbd: unknown, not an error
    assert d["kernel"].startswith("Linux") and d["cpus"] == os.cpu_count()
    assert d["mem_total_mib"] > 0 and 0 < d["device_dir_free_mib"] <= 512


def test_sample_state_over_adb_is_cheap_and_complete(target):
    t0 = time.monotonic()
    s = target.sample_state()
    assert time.monotonic() - t0 < 0.3
    assert s["mem_available_mib"] > 0 and abs(s["t"] - time.time()) < 5
    assert s["battery"] is None  # no dumpsys here
    assert "error" not in s
    # the VM's sysfs has no thermal zones or cpufreq policies; whatever is there must match a local read
    from harness.devices import state as devstate

    local = devstate.read_local(Path("/"))
    assert s["thermal"].keys() == local["thermal"].keys() and s["cpufreq"].keys() == local["cpufreq"].keys()


def test_stage_pushes_once_verifies_and_repushes_a_changed_file(target, tmp_path):
    f = tmp_path / "model.gguf"
    f.write_bytes(os.urandom(3 << 20))
    remote = target.stage(f, "model")
    assert remote == "/data/local/tmp/bmoe/model.gguf"
    assert target.stage_log[-1] == (remote, "pushed")
    assert target.device.remote_size(remote) == f.stat().st_size
    assert Path(remote).read_bytes() == f.read_bytes()  # the device is this machine: check the bytes too
    inode = target.device.shell(sh_join(["stat", "-c", "%i", remote]))[1]

    assert target.stage(f, "model") == remote
    assert target.stage_log[-1] == (remote, "unchanged")
    assert target.device.shell(sh_join(["stat", "-c", "%i", remote]))[1] == inode  # not rewritten

    data = bytearray(f.read_bytes())
    data[1000] ^= 0xFF  # same size, different content
    f.write_bytes(bytes(data))
    target.stage(f, "model")
    assert target.stage_log[-1] == (remote, "pushed")
    assert Path(remote).read_bytes() == bytes(data)
    assert not Path(remote + ".part").exists()


def test_stage_refuses_when_the_device_is_short_of_space(target, tmp_path):
    free_kib = target.device.free_kib(target.device_dir)
    big = tmp_path / "huge.gguf"
    with open(big, "wb") as fh:  # sparse: bigger than the device's free space, cheap here
        fh.truncate((free_kib + 1024) * 1024)
    with pytest.raises(UserError, match=r"model huge.gguf: needs \d+ MiB free in /data/local/tmp/bmoe"):
        target.stage(big, "model")
    assert target.device.remote_size(f"{target.device_dir}/huge.gguf") is None
    assert target.device.remote_size(f"{target.device_dir}/huge.gguf.part") is None


def test_run_streams_logs_and_pulls(target, engine, tmp_path):
    lines: list[str] = []
    csv = f"{target.run_dir()}/tokens.csv"
    out = _run(target, [engine, "ok"], tmp_path, outputs=[csv], on_stdout_line=lines.append)
    assert out.ok, out.reason
    assert [ln for ln in lines if ln.startswith("BMOE_PROGRESS")] == [
        f'BMOE_PROGRESS {{"token": {i}}}' for i in (1, 2, 3)
    ]
    assert out.fetched[csv].read_text() == "token,wall_s\n1,0.1\n"
    assert target.device.remote_size(csv) is None  # pulled outputs in the run dir are moved, not copied
    log = (tmp_path / "run.log").read_text()
    assert "a warning" in log and 'BMOE_PROGRESS {"token": 3}' in log
    assert out.remote_pid is not None and f"engine pid {out.remote_pid}" in lines


def test_run_failure_reports_exit_code_and_last_stderr_line(target, engine, tmp_path):
    out = _run(target, [engine, "fail"], tmp_path)
    assert out.exit_code == 3 and not out.ok
    assert out.reason == "engine exited 3: fatal: model file is truncated"


def test_missing_output_fails_the_run(target, engine, tmp_path):
    out = _run(target, [engine, "ok"], tmp_path, outputs=[f"{target.run_dir()}/never.csv"])
    assert out.exit_code == 0 and out.reason == f"engine exited 0 but did not write {target.run_dir()}/never.csv"


def test_prompt_and_paths_cannot_inject_shell(target, engine, tmp_path):
    markers = [Path(f"/tmp/bmoe-pwned-{os.getpid()}-{i}") for i in range(3)]
    pwned = Path("/tmp/pwned")
    pwned_before = pwned.exists()
    prompt = [
        "'; touch /tmp/pwned; '",
        f"'; touch {markers[0]}; '",
        f"$(touch {markers[1]})",
        f"`touch {markers[2]}`",
        'Tell me a story; then "quote" it && exit 0 | cat > /dev/null\nnew line $HOME *',
    ]
    out = _run(
        target,
        [engine, "ok", "-p", *prompt, "-m", "/data/local/tmp/bmoe/a model;rm -rf ~.gguf"],
        tmp_path,
        outputs=[f"{target.run_dir()}/args.bin"],
    )
    assert out.ok, out.reason
    got = out.fetched[f"{target.run_dir()}/args.bin"].read_bytes().split(b"\0")[:-1]
    assert got == [w.encode() for w in ["ok", "-p", *prompt, "-m", "/data/local/tmp/bmoe/a model;rm -rf ~.gguf"]]
    assert not any(m.exists() for m in markers)
    assert pwned.exists() == pwned_before


def test_timeout_kills_the_engine_on_the_device(target, engine, tmp_path):
    t0 = time.monotonic()
    out = _run(target, [engine, "sleep", "60"], tmp_path, timeout_s=2)
    assert time.monotonic() - t0 < 10
    assert out.reason == "timeout after 2 s" and out.exit_code is None
    assert out.remote_pid is not None
    time.sleep(0.3)
    assert not _remote_alive(target, out.remote_pid)


def test_keyboard_interrupt_kills_the_engine_by_pid_and_reraises(target, engine, tmp_path):
    lines: list[str] = []
    with sigint_after(1.5), pytest.raises(KeyboardInterrupt):
        _run(target, [engine, "sleep", "60"], tmp_path, timeout_s=60, on_stdout_line=lines.append)
    pid = int(next(ln for ln in lines if ln.startswith("engine pid")).split()[-1])
    time.sleep(0.3)
    assert not _remote_alive(target, pid)


def test_missing_serial_and_ambiguity_are_user_errors(second_device):
    with pytest.raises(UserError, match=r"no such adb device \(adb devices lists: .*127\.0\.0\.1:15555 \(device\)"):
        AdbTarget("no-such-serial")
    with pytest.raises(UserError, match=r"several adb devices .*15555.*15556"):
        AdbTarget(None)


def _run_until_adbd_dies(second_device, tmp_path: Path, args: list[str], timeout_s: float, outputs_of=None):
    """Stage the fake engine on the second device, run it with args and kill that adbd 1.5 s in:
    (target, staged engine path, outcome, stdout lines)."""
    serial, proc = second_device
    t = AdbTarget(serial)
    eng = tmp_path / "slow-engine.sh"
    eng.write_text(ENGINE)
    eng.chmod(0o755)
    remote = t.stage(eng, "engine")
    lines: list[str] = []
    killer = threading.Timer(1.5, proc.kill)
    killer.start()
    try:
        out = t.run([remote, *args], timeout_s=timeout_s, outputs=outputs_of(t) if outputs_of else [],
                    out_dir=tmp_path / "out", log_path=tmp_path / "log1", on_stdout_line=lines.append)
    finally:
        killer.cancel()
    return t, remote, out, lines


def test_device_that_disappears_mid_run_is_a_failed_run(second_device, tmp_path):
    t, _, out, lines = _run_until_adbd_dies(second_device, tmp_path, ["sleep", "20"], 30,
                                            lambda t: [f"{t.run_dir()}/tokens.csv"])
    assert out.exit_code is None and not out.ok
    assert out.reason is not None and out.reason.startswith("device gone: 127.0.0.1:15556"), out.reason
    assert out.wall_s < 10
    s = t.sample_state()
    assert s["error"].startswith("device gone") and s["mem_available_mib"] is None and s["thermal"] == {}
    # the orphaned engine is still running on "the device" (this machine): clean it up
    pid = int(next(ln for ln in lines if ln.startswith("engine pid")).split()[-1])
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_devices_command_lists_states_and_fails_in_one_line(second_device, capsys):
    from harness.bench_cli import main

    assert main(["devices"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"{SERIAL}\tdevice" in out and "127.0.0.1:15556\tdevice" in out
    assert main(["devices", "-l"]) == 0
    out = capsys.readouterr().out
    assert "MiB free in /data/local/tmp" in out
    assert main(["devices", "--port", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: adb is not usable (server 127.0.0.1:1)")


# ---- a second adbd, which a test may kill ---------------------------------------------------------------


def _only_loopback() -> bool:
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    names = {ln.split(":")[1].strip().split("@")[0] for ln in links.splitlines() if ":" in ln}
    return names == {"lo"}


@pytest.fixture
def second_device():
    launcher = os.environ.get("BMOE_TEST_ADBD")
    if not launcher:
        pytest.skip("needs BMOE_TEST_ADBD (set by tests/adbd/run-adb-tests.sh)")
    assert _only_loopback(), "refusing to start adbd: this network namespace has interfaces other than lo"
    port = 15556
    serial = f"127.0.0.1:{port}"
    proc = None
    try:
        proc = _start_adbd(launcher, port)
        yield serial, proc
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        subprocess.run([os.environ["BMOE_TEST_ADB"], "disconnect", serial], capture_output=True, timeout=20)


def _start_adbd(launcher: str, port: int) -> subprocess.Popen:
    """Start an adbd on 127.0.0.1:port and connect the adb server to it."""
    env = {"ADBD_PORT": str(port), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/"}
    proc = subprocess.Popen(
        [launcher], cwd="/", env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    serial = f"127.0.0.1:{port}"
    adb = os.environ["BMOE_TEST_ADB"]
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        subprocess.run([adb, "connect", serial], check=True, capture_output=True, timeout=20)
        subprocess.run([adb, "-s", serial, "wait-for-device"], check=True, timeout=20)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc


def _local_alive(pid: int) -> bool:
    """The loopback "device" is this machine: is pid a live (not zombie) process here?"""
    try:
        return "\tZ" not in Path(f"/proc/{pid}/status").read_text().split("State:")[1].splitlines()[0]
    except (FileNotFoundError, IndexError):
        return False


def test_engine_left_running_by_a_lost_device_is_killed_when_it_returns(second_device, tmp_path):
    """adbd dies mid-run (the engine lives on, orphaned); once the device is back, the target's next
    run first kills that engine - checked by its run mark, so only that process - and logs it."""
    serial, proc = second_device
    t, remote, out, lines = _run_until_adbd_dies(second_device, tmp_path, ["spin"], 120)
    assert out.reason is not None and out.reason.startswith("device gone"), out.reason
    pid = int(next(ln for ln in lines if ln.startswith("engine pid")).split()[-1])
    proc.wait()
    bystander = subprocess.Popen(["sleep", "60"])  # not the engine: must survive the reaping
    proc2 = None
    try:
        assert _local_alive(pid), "the orphaned engine should still be running"
        assert t.reap_orphans() == []  # device still gone: nothing done, kept for later
        proc2 = _start_adbd(os.environ["BMOE_TEST_ADBD"], int(serial.rsplit(":", 1)[1]))
        out2 = t.run([remote], timeout_s=30, outputs=[], out_dir=tmp_path / "out2", log_path=tmp_path / "log2")
        assert out2.ok, out2.reason
        assert f"killed engine pid {pid} on the device" in (tmp_path / "log2").read_text()
        time.sleep(0.3)
        assert not _local_alive(pid)
        assert _local_alive(bystander.pid)
        assert t.reap_orphans() == []  # reaped once only
    finally:
        bystander.kill()
        bystander.wait()
        if _local_alive(pid):
            os.kill(pid, signal.SIGKILL)
        if proc2 is not None:
            proc2.kill()
            proc2.wait()
