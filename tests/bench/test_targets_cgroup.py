"""The memory cap: cgroup discovery (pure, fixture trees) and a real cap on this machine's cgroups."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import UserError
from harness.targets import LocalTarget
from harness.targets.cgroup import CappedCgroup, locate, locate_self, parse_mountinfo, parse_proc_cgroup

PY = sys.executable

V1_PROC = """12:pids:/
4:memory:/process_api/abc
1:cpu,cpuacct:/x
0::/
"""


def _mountinfo(v1_point: Path | None, v2_point: Path | None) -> str:
    lines = ["22 1 0:21 / /proc rw,nosuid - proc proc rw"]
    if v2_point is not None:
        lines.append(f"30 25 0:26 / {v2_point} rw,relatime shared:5 - cgroup2 cgroup2 rw")
    if v1_point is not None:
        lines.append(f"36 25 0:31 / {v1_point} rw,relatime shared:9 - cgroup cgroup rw,memory")
        lines.append("37 25 0:32 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu")
    return "\n".join(lines) + "\n"


def test_parse_proc_cgroup_splits_controllers_and_keys_v2_as_empty():
    got = parse_proc_cgroup(V1_PROC)
    assert got["memory"] == "/process_api/abc"
    assert got["cpu"] == got["cpuacct"] == "/x"
    assert got[""] == "/"


def test_parse_mountinfo_keeps_only_cgroup_mounts_with_options():
    got = parse_mountinfo(_mountinfo(Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup/unified")))
    assert ("cgroup2", "/", "/sys/fs/cgroup/unified", {"rw"}) in got
    assert ("cgroup", "/", "/sys/fs/cgroup/memory", {"rw", "memory"}) in got
    assert all(m[0] in ("cgroup", "cgroup2") for m in got)


def test_locate_v1_when_v2_has_no_memory_controller(tmp_path):
    v1, v2 = tmp_path / "memory", tmp_path / "unified"
    (v1 / "process_api/abc").mkdir(parents=True)
    (v1 / "process_api/abc/memory.limit_in_bytes").write_text("9223372036854771712\n")
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("hugetlb\n")  # like this machine's hybrid layout
    base = locate(V1_PROC, _mountinfo(v1, v2))
    assert base.version == 1 and base.dir == v1 / "process_api/abc"


def test_locate_prefers_v2_with_memory(tmp_path):
    v2 = tmp_path / "cg2"
    (v2 / "user.slice/me").mkdir(parents=True)
    (v2 / "user.slice/me/cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    base = locate("0::/user.slice/me\n", _mountinfo(None, v2))
    assert base.version == 2 and base.dir == v2 / "user.slice/me"


def test_locate_without_memory_controller_is_a_user_error(tmp_path):
    v2 = tmp_path / "cg2"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpu pids\n")
    with pytest.raises(UserError, match="no usable cgroup memory controller"):
        locate("0::/\n", _mountinfo(None, v2))


# ---- real caps on this machine ------------------------------------------------------------------------


def _cgroups_usable() -> str | None:
    try:
        base = locate_self()
    except UserError as e:
        return str(e)
    try:
        with CappedCgroup(base, 64):
            pass
    except UserError as e:
        return str(e)
    return None


_why = _cgroups_usable()
needs_cgroup = pytest.mark.skipif(_why is not None, reason=f"cgroup memory cap not usable here: {_why}")


def _children(base_dir: Path) -> list[str]:
    """This process's own run cgroups (`bmoe-<pid>-<n>`): another harness on the machine (a second suite, a user's
    capped run) shares the parent and adds and removes its own children while a test runs."""
    return sorted(p.name for p in base_dir.iterdir() if p.name.startswith(f"bmoe-{os.getpid()}-"))


def _run_py(target: LocalTarget, code: str, tmp_path: Path):
    """Run `python -c code` on the target: (outcome, stdout lines)."""
    lines: list[str] = []
    out = target.run([PY, "-c", code], timeout_s=60, outputs=[], out_dir=tmp_path, log_path=tmp_path / "log",
                     on_stdout_line=lines.append)
    return out, lines


@needs_cgroup
def test_allocation_past_the_cap_is_oom_killed_and_reported(tmp_path):
    target = LocalTarget(mem_cap_mib=64)
    base_dir = Path(target.describe()["cgroup"]["parent"])
    before = _children(base_dir)
    code = "import sys; print('start', flush=True); x = b'x' * (400 << 20); print('survived', len(x))"
    out, lines = _run_py(target, code, tmp_path)
    assert out.oom_killed
    assert out.reason.startswith("killed by the kernel's OOM killer under the 64 MiB cap (cgroup memory.")
    assert "oom_kill 1)" in out.reason, out.reason
    assert out.exit_code is None and not out.ok
    assert lines == ["start"]
    assert out.peak_mem_mib is not None and 32 < out.peak_mem_mib <= 64.0
    assert _children(base_dir) == before, "the run's cgroup child was not removed"


@needs_cgroup
def test_allocation_under_the_cap_succeeds_and_reports_peak(tmp_path):
    target = LocalTarget(mem_cap_mib=256)
    base_dir = Path(target.describe()["cgroup"]["parent"])
    before = _children(base_dir)
    code = "x = b'x' * (100 << 20); print(len(x))"
    out, lines = _run_py(target, code, tmp_path)
    assert out.ok and not out.oom_killed, out.reason
    assert lines == [str(100 << 20)]
    assert out.peak_mem_mib is not None and 100 <= out.peak_mem_mib <= 256
    assert _children(base_dir) == before


@needs_cgroup
def test_the_child_process_runs_inside_the_child_cgroup(tmp_path):
    target = LocalTarget(mem_cap_mib=128)
    lines: list[str] = []
    out = target.run(
        [PY, "-c", "print(open('/proc/self/cgroup').read())"],
        timeout_s=30,
        outputs=[],
        out_dir=tmp_path,
        log_path=tmp_path / "log",
        on_stdout_line=lines.append,
    )
    assert out.ok
    mine = Path("/proc/self/cgroup").read_text()
    theirs = "\n".join(lines)
    assert "/bmoe-" in theirs and "/bmoe-" not in mine


@needs_cgroup
def test_capped_cli_prints_peak_and_passes_exit_code(tmp_path):
    r = subprocess.run(
        [
            PY,
            "-m",
            "harness.targets.capped",
            "--mem-mib",
            "256",
            "--",
            PY,
            "-c",
            "import sys; x = b'x' * (80 << 20); print('ok'); sys.exit(5)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert r.returncode == 5, r.stderr
    assert r.stdout.strip() == "ok"
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("BMOE_CAPPED ")][-1]
    rec = json.loads(line.split(" ", 1)[1])
    assert rec["exit_code"] == 5 and rec["oom_killed"] is False and rec["mem_cap_mib"] == 256
    assert 80 <= rec["peak_mib"] <= 256


@needs_cgroup
def test_capped_cli_reports_oom(tmp_path):
    r = subprocess.run(
        [PY, "-m", "harness.targets.capped", "--mem-mib", "48", "--", PY, "-c", "x = b'x' * (300 << 20)"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert r.returncode == 137
    rec = json.loads([ln for ln in r.stderr.splitlines() if ln.startswith("BMOE_CAPPED ")][-1].split(" ", 1)[1])
    assert rec["oom_killed"] is True and rec["exit_code"] is None
    said = [ln for ln in r.stderr.splitlines() if ln.startswith("capped: ")]
    assert len(said) == 1 and "was killed by the kernel's OOM killer under the 48 MiB cap" in said[0], r.stderr
    assert rec["oom_reason"] in said[0]


def test_v2_control_files_on_a_plain_directory_tree(tmp_path):
    """The v2 file protocol (no v2 memory controller on this machine to test live): subtree_control is
    asked for +memory, memory.max and memory.swap.max are set, memory.events and memory.peak are read."""
    from harness.targets.cgroup import CgroupBase

    base = tmp_path / "user.slice"
    base.mkdir()
    (base / "cgroup.subtree_control").write_text("")
    cg = CappedCgroup(CgroupBase(2, base), 300)
    assert cg.dir.parent == base and cg.dir.name.startswith(f"bmoe-{os.getpid()}-")
    assert (base / "cgroup.subtree_control").read_text() == "+memory"
    assert (cg.dir / "memory.max").read_text() == str(300 << 20)
    assert not (cg.dir / "memory.swap.max").exists()  # only set where the kernel offers it
    assert cg.oom_kills() == 0 and cg.peak_bytes() is None
    (cg.dir / "memory.events").write_text("low 0\nhigh 0\nmax 17\noom 2\noom_kill 2\noom_group_kill 0\n")
    (cg.dir / "memory.peak").write_text("314572800\n")
    assert cg.oom_kills() == 2 and cg.peak_bytes() == 300 << 20
    assert cg.wrap_argv(["eng", "-p", "x y"]) == [
        "/bin/sh",
        "-c",
        'echo $$ > "$0" && exec "$@"',
        str(cg.dir / "cgroup.procs"),
        "eng",
        "-p",
        "x y",
    ]


def test_bad_cap_is_a_user_error(tmp_path):
    from harness.targets.cgroup import CgroupBase

    with pytest.raises(UserError, match="not a positive size"):
        CappedCgroup(CgroupBase(1, tmp_path), 0)


@needs_cgroup
def test_stale_children_of_dead_harness_processes_are_removed():
    from harness.targets.cgroup import remove_stale

    base = locate_self()
    p = subprocess.Popen(["true"])
    p.wait()
    stale = base.dir / f"bmoe-{p.pid}-0"
    live = base.dir / f"bmoe-{os.getpid()}-999999"
    stale.mkdir()
    live.mkdir()
    try:
        assert stale in remove_stale(base)
        assert not stale.exists() and live.exists()  # ours (alive) is left alone
    finally:
        for d in (stale, live):
            if d.exists():
                d.rmdir()


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping the page cache needs root")
@pytest.mark.skipif(
    os.environ.get("BMOE_TEST_DROP_CACHES") != "1",
    reason="drops the whole machine's page cache (disturbs benchmarks running beside it): set BMOE_TEST_DROP_CACHES=1",
)
def test_drop_caches_as_root_lowers_cached(tmp_path):
    from harness.devices import state as devstate

    f = tmp_path / "blob"
    f.write_bytes(os.urandom(64 << 20))
    f.read_bytes()  # now in the page cache
    before = devstate.read_local()["cached_mib"]
    assert LocalTarget().drop_caches() is True
    after = devstate.read_local()["cached_mib"]
    assert after < before - 32  # at least half of our 64 MiB left the cache (others may be filling it)


def test_drop_caches_flag_needs_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(UserError, match="drop_caches: dropping the page cache needs root"):
        LocalTarget(drop_caches=True)
    assert LocalTarget().drop_caches() is False


def test_capped_cli_without_a_command_is_one_line_error():
    r = subprocess.run(
        [PY, "-m", "harness.targets.capped", "--mem-mib", "64", "--"], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["Error: no command given: use -- CMD [ARGS...]"]
