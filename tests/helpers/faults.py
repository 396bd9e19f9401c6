"""Shared by the fault-injection tests (test_faults*.py): bmoe-bench as a real process or in this process, the
one-line error check, a campaign whose engine waits at a gate file, a real 3 MiB tmpfs and a filler, and a
finished campaign folder to copy and break."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.runner import BENCH, campaign


def bench(*args: object, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*BENCH, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=_env())


def cli(*args: object) -> subprocess.CompletedProcess:
    """`bmoe-bench ARGS` in this process (report, validate: no interpreter start per call), as a process result."""
    import contextlib
    import io

    from harness.bench_cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return subprocess.CompletedProcess(list(args), rc, out.getvalue(), err.getvalue())


def start(*args: object) -> subprocess.Popen:
    return subprocess.Popen([*BENCH, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env())


def _env() -> dict[str, str]:
    return dict(os.environ)


def error_line(stderr: str) -> str:
    """The one `Error:` line of a bmoe-bench run, and no traceback."""
    assert "Traceback" not in stderr, stderr
    errs = [ln for ln in stderr.splitlines() if ln.startswith("Error:")]
    assert len(errs) == 1, stderr
    return errs[0]


def held(tmp_path: Path, **kw) -> tuple[Path, Path]:
    """The runner_helpers campaign whose engine waits after its first token until the gate file exists."""
    p = campaign(tmp_path, **kw)
    gate = tmp_path / "go"
    p.write_text(p.read_text().replace("--sleep-ms: ", f"--hold: {gate}, --sleep-ms: ", 1)
                 .replace("timeout_s: 60", "timeout_s: 600"))
    return p, gate


def in_flight(folder: Path) -> list[Path]:
    return list((folder / "runs").glob(".*.tmp"))


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "gone"


def folders(out: Path) -> list[Path]:
    return sorted(d for d in out.iterdir() if d.is_dir() and not d.name.startswith(".")) if out.is_dir() else []


def check_ok(folder: Path) -> None:
    r = cli("report", folder, "--check")
    assert r.returncode == 0, r.stderr


def manifest_runs(folder: Path) -> dict[str, dict]:
    return {r["run_id"]: r for r in json.loads((folder / "manifest.json").read_text())["runs"]}


def mount_tmpfs(tmp_path: Path):
    """A real 3 MiB tmpfs under tmp_path, for a fixture to yield from (needs root; skipped elsewhere)."""
    d = tmp_path / "tmpfs"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def fill(d: Path, leave: int = 0) -> Path:
    """Fill the filesystem holding d, leaving about `leave` bytes."""
    f = d / "filler"
    with open(f, "ab", buffering=0) as fh:
        n = shutil.disk_usage(d).free - leave
        try:
            while n > 0:
                fh.write(b"\0" * min(n, 1 << 20))
                fh.flush()
                n -= 1 << 20
            if leave == 0:
                while True:
                    fh.write(b"\0" * 4096)
                    fh.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return f


def done_campaign(tmp: Path) -> Path:
    """A finished campaign (2 cells x 2 repeats, report written) under tmp, to copy and break."""
    p = campaign(tmp, repeats=2)
    r = bench("run", p, "--out", tmp / "bd")
    assert r.returncode == 0, r.stderr
    (folder,) = folders(tmp / "bd")
    return folder


def copy_of(done_folder: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "bd" / done_folder.name
    shutil.copytree(done_folder, dest)
    return dest
