"""Hostile campaign folders for the fault tests: a real folder made by the fake engine (tests/fixtures/fake_engine.py),
copied and then crafted the way an attacker would commit it, a sentinel tree beside it (files with known contents,
mtimes and atimes) to prove that nothing outside the folder was read, written or deleted, and `bmoe-bench` run on it
as a process: spawned (`python -m harness.bench_cli`, as a user runs it) or forked from this already-loaded
interpreter (the same `main(argv)` in a process of its own, without the second of imports each spawn costs)."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from harness.campaigns.runner import run_campaign
from harness.report.build import write_report
from tests.helpers.runner import BENCH, campaign, quiet

REPO = Path(__file__).resolve().parents[2]
SECRET = "SENTINEL-7f3a9c-outside-the-folder"  # contents of every sentinel file: must never be printed
SECRET_NAME = "secret-name-b41d.txt"  # a file under the directory a crafted run id points at
OLD_M = 946684800  # 2000-01-01: sentinel mtimes
OLD_A = 978307200  # 2001-01-01: sentinel atimes (relatime updates an atime this old on any read)


@dataclass
class Base:
    yaml: Path  # the campaign file (its fake engine and model beside it)
    complete: Path  # a finished folder with its report written
    resumable: Path  # the same, its last run pending again and its status `interrupted` (what `run` resumes)


def make_base(tmp: Path) -> Base:
    """A two-cell, two-round campaign run by the fake engine, reported; and a resumable copy."""
    yaml = campaign(tmp, repeats=2, tokens=6)
    res = run_campaign(yaml, root=tmp / "made", console=quiet())
    write_report(res.folder)
    resumable = tmp / "resumable" / res.folder.name
    shutil.copytree(res.folder, resumable)
    m = json.loads((resumable / "manifest.json").read_text())
    last = m["runs"][-1]
    m["runs"][-1] = {k: last[k] for k in ("run_id", "round", "cell", "position")} | {"status": "pending"}
    m["status"] = "interrupted"
    (resumable / "manifest.json").write_text(json.dumps(m, indent=1) + "\n")
    shutil.rmtree(resumable / "runs" / last["run_id"])
    return Base(yaml=yaml, complete=res.folder, resumable=resumable)


def place(src: Path, tmp: Path) -> tuple[Path, Path]:
    """A copy of folder src under tmp/bd/ (its name kept: `run` finds it there), and the sentinel tree
    tmp/outside/: (folder, outside)."""
    folder = tmp / "bd" / src.name
    shutil.copytree(src, folder)
    outside = tmp / "outside"
    (outside / "secret-dir").mkdir(parents=True)
    (outside / "victim.txt").write_text(SECRET + "\n")
    (outside / "secret-dir" / SECRET_NAME).write_text(SECRET + " (in a directory a run id points at)\n")
    (outside / "secret-dir" / "metrics.csv").write_text(SECRET + "\n")
    (outside / "plots-target").mkdir()
    (outside / "plots-target" / "tok_s.png").write_text(SECRET + "\n")
    return folder, outside


def age(tree: Path) -> None:
    """Give every file and folder of the sentinel tree its old mtime and atime (after it is crafted)."""
    for p in sorted(tree.rglob("*"), key=lambda q: -len(q.parts)):  # deepest first: a folder's times last
        os.utime(p, (OLD_A, OLD_M), follow_symlinks=False)
    os.utime(tree, (OLD_A, OLD_M))


def snapshot(tree: Path) -> dict[str, tuple]:
    """Every entry of the tree: its kind, bytes (files), link target (links), mtime and atime."""
    out: dict[str, tuple] = {}
    for p in [tree, *sorted(tree.rglob("*"))]:
        st = os.lstat(p)
        rel = p.relative_to(tree).as_posix()
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p), st.st_mtime_ns)
        elif p.is_dir():  # its atime is not compared: listing it (this snapshot does) sets it
            out[rel] = ("dir", st.st_mtime_ns)
        else:
            out[rel] = ("file", p.read_bytes(), st.st_mtime_ns, st.st_atime_ns)
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # this read must not count as the command's
    return out


def secrets_hashes(tree: Path) -> set[str]:
    """sha256 of every sentinel file (none may appear in anything the command printed or wrote)."""
    out = set()
    for p in tree.rglob("*"):
        if p.is_file() and not p.is_symlink():
            st = os.stat(p)
            out.add(hashlib.sha256(p.read_bytes()).hexdigest())
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    return out


def atime_works(tmp: Path) -> bool:
    """Whether this filesystem records a read in the atime (relatime: when the atime is older than a day)."""
    p = tmp / "atime-probe"
    p.write_text("x")
    os.utime(p, (OLD_A, OLD_M))
    p.read_text()
    works = os.stat(p).st_atime_ns != OLD_A * 10**9
    p.unlink()
    return works


PRELOAD = ("harness.report.build", "harness.report.checker", "harness.report.quality", "harness.report.plots",
           "harness.campaigns.runner", "harness.campaigns.validate", "harness.formats.grades",
           "harness.targets.local", "matplotlib.pyplot")


@dataclass
class Result:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str


def spawn(argv: list[str], cwd: Path, timeout: float = 120.0, prefix: tuple[str, ...] = ()) -> Result:
    """`python -m harness.bench_cli ARGV` as a user runs it (prefix: e.g. setpriv dropping capabilities)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout's harness, whatever the cwd
    r = subprocess.run([*prefix, *BENCH, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return Result(argv, r.returncode, r.stdout, r.stderr)


def forked(argv: list[str], cwd: Path, timeout: float = 60.0) -> Result:
    """bmoe-bench's main(argv) in a forked child with its own stdout and stderr files, an uncaught exception
    printed as the interpreter prints it (a traceback, exit 1); killed after `timeout` s (returncode -9)."""
    from harness.bench_cli import main

    for mod in PRELOAD:  # what the commands import when they run: loaded once here, not in every child
        importlib.import_module(mod)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            rc = 1
            try:
                os.chdir(cwd)
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
                rc = main(argv)
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else 1
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(rc)
        t0 = time.monotonic()
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() - t0 > timeout:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                status = -9
                break
            time.sleep(0.01)
        rc = os.waitstatus_to_exitcode(status) if status != -9 else -9
        out.seek(0)
        err.seek(0)
        return Result(argv, rc, out.read().decode(errors="replace"), err.read().decode(errors="replace"))


def one_line_refusal(r: Result) -> str:
    """The one error line of a refused command (asserting: non-zero, no traceback, one line on stderr; `check`
    adds its count line after the folder's line), returned for the caller to match."""
    where = f"bmoe-bench {' '.join(r.argv)}"
    assert r.returncode not in (0, -9), f"{where}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr + r.stdout, f"{where}:\n{r.stderr}"
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    if r.argv[0] == "check":
        assert lines and lines[-1].startswith("Error: 1 of 1 folder(s) failed the check"), f"{where}:\n{r.stderr}"
        lines = lines[:-1]
    assert len(lines) == 1, f"{where}: {len(lines)} lines on stderr:\n{r.stderr}"
    return lines[0]
