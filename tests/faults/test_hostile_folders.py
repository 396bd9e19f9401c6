"""A campaign folder is untrusted input (issue 23, items 1-5): a corpus of crafted folders, each run through the
commands that open a folder (`run` resuming it, `report`, `report --check`, `check`, `grade`), each refused with one
line and a non-zero exit, no traceback, and nothing outside the folder read, written or deleted: a sentinel tree
beside it (known contents, mtimes and atimes) is compared before and after every command, and its file names,
contents and sha256 never appear in what a command printed or left in the folder.

Every command runs as a process: one per case spawned as a user runs it (`python -m harness.bench_cli`), the others
forked from this interpreter (tests.helpers.hostile.forked: the same main, without a second of imports each)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.hostile import (
    SECRET,
    SECRET_NAME,
    Base,
    age,
    atime_works,
    forked,
    make_base,
    one_line_refusal,
    place,
    secrets_hashes,
    snapshot,
    spawn,
)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Base:
    return make_base(tmp_path_factory.mktemp("hostile-base"))


def _edit(folder: Path, change: Callable[[dict], None]) -> None:
    m = json.loads((folder / "manifest.json").read_text())
    change(m)
    (folder / "manifest.json").write_text(json.dumps(m, indent=1) + "\n")


def _link_out(folder: Path, name: str, target: Path, *, move: bool = False) -> None:
    """folder/name replaced by a symbolic link to target (move: the original moved there first)."""
    p = folder / name
    if move:
        shutil.move(p, target)
    elif p.is_dir():
        shutil.rmtree(p)
    elif p.exists():
        p.unlink()
    p.symlink_to(target)


def _fifo(p: Path) -> None:
    """p replaced by a FIFO (reading it would hang)."""
    p.unlink()
    os.mkfifo(p)


def _pending(m: dict) -> dict:
    return next(r for r in m["runs"] if r["status"] == "pending")


def _finished(m: dict) -> dict:
    return next(r for r in m["runs"] if r["status"] != "pending")


# name -> (craft(folder, outside), the commands to run, what the one line must say)
ALL = ("run", "report", "report --check", "check", "grade")
CASES: dict[str, tuple[Callable[[Path, Path], None], tuple[str, ...], str]] = {
    # item 1: a pending run whose id is a path: resuming it deleted and wrote that path
    "run-id-absolute": (lambda f, o: _edit(f, lambda m: _pending(m).update(run_id=str(o / "secret-dir"))), ALL,
                        "run id '/"),
    # item 1: a finished run's id climbing out: --check hashed that directory and printed its file names
    "run-id-dotdot": (lambda f, o: _edit(f, lambda m: _finished(m).update(run_id="../../../outside/secret-dir")),
                      ALL, "run id '../../../outside/secret-dir' is not of the form r<round>-c<cell>"),
    # item 2: the lock files as links: taking the lock truncated and overwrote the target
    "folder-lock-link": (lambda f, o: (f / ".lock").symlink_to(o / "victim.txt"), ALL, "'.lock' (a symbolic link)"),
    "campaign-lock-link": (lambda f, o: (f.parent / ".t.lock").symlink_to(o / "victim.txt"), ("run",),
                           ".t.lock: a symbolic link where bmoe-bench keeps its lock file"),
    # item 3: links where the report writes and the runner deletes and writes
    "plots-link": (lambda f, o: _link_out(f, "plots", o / "plots-target"), ALL, "'plots' (a symbolic link)"),
    "runs-link": (lambda f, o: _link_out(f, "runs", o / "runs-moved", move=True), ALL, "'runs' (a symbolic link)"),
    "run-folder-link": (lambda f, o: _link_out(f, "runs/r01-c00", o / "run-moved", move=True), ALL,
                        "'runs/r01-c00' (a symbolic link)"),
    "pending-run-folder-link": (lambda f, o: _link_out(f, "runs/r02-c00", o / "secret-dir"), ALL,
                                "'runs/r02-c00' (a symbolic link)"),
    "findings-link": (lambda f, o: _link_out(f, "findings.md", o / "victim.txt"), ALL,
                      "'findings.md' (a symbolic link)"),
    "results-link": (lambda f, o: _link_out(f, "results.csv", o / "victim.txt"), ALL,
                     "'results.csv' (a symbolic link)"),
    "manifest-link": (lambda f, o: _link_out(f, "manifest.json", o / "manifest.json", move=True), ALL,
                      "'manifest.json' (a symbolic link)"),
    "fifo-in-a-run": (lambda f, o: _fifo(f / "runs/r01-c00/state.jsonl"), ALL,
                      "'runs/r01-c00/state.jsonl' (not a plain file)"),
    # hostile sizes: a 50 MB manifest, one nested 100000 deep
    "huge-manifest": (lambda f, o: _edit(f, lambda m: m["campaign"].update(description="x" * 50_000_000)), ALL,
                      "manifest.json: larger than 40 MiB"),
    "deep-manifest": (lambda f, o: (f / "manifest.json").write_text(
        (f / "manifest.json").read_text().replace('"model": {', '"model": {"recipe": ' + "[" * 100_000 + "]" * 100_000
                                                  + ", ", 1)), ALL, "manifest.json: JSON nested deeper than 32"),
}
ARGV = {"run": lambda b, f: ["run", str(b.yaml), "--out", str(f.parent), "--no-report"],
        "report": lambda b, f: ["report", str(f)], "report --check": lambda b, f: ["report", str(f), "--check"],
        "check": lambda b, f: ["check", str(f)], "grade": lambda b, f: ["grade", str(f)]}


@pytest.mark.parametrize("name", list(CASES))
def test_a_hostile_folder_is_refused_in_one_line_touching_nothing_outside(name, base, tmp_path):
    craft, commands, says = CASES[name]
    folder, outside = place(base.resumable, tmp_path)
    secrets = secrets_hashes(outside)  # the sentinel files proper (a crafted folder may move its own files out)
    craft(folder, outside)
    age(outside)
    i = list(CASES).index(name)
    spawned = commands[i % len(commands)] if i < len(ALL) else None  # each command spawned once in the corpus
    for cmd in commands:
        before, root_before = snapshot(outside), sorted(os.listdir(folder.parent))
        argv = ARGV[cmd](base, folder)
        r = spawn(argv, tmp_path, timeout=60) if cmd == spawned else forked(argv, tmp_path, timeout=20)
        line = one_line_refusal(r)
        assert says in line, f"bmoe-bench {cmd}: {line}"
        assert str(folder) in line or str(folder.parent) in line, line  # it names the folder
        shown = r.stdout + r.stderr
        assert SECRET not in shown and SECRET_NAME not in shown and not any(h in shown for h in secrets)
        assert snapshot(outside) == before, f"bmoe-bench {cmd} touched the sentinel tree beside the folder"
        assert sorted(os.listdir(folder.parent)) == root_before, f"bmoe-bench {cmd} left something in --out"
        if (folder / "manifest.json").is_file() and not (folder / "manifest.json").is_symlink():
            kept = (folder / "manifest.json").read_text()
            assert SECRET_NAME not in kept and not any(h in kept for h in secrets)


def test_the_sentinel_tree_sees_a_read(tmp_path):
    """The comparison the corpus rests on: a read of a sentinel file changes the snapshot (relatime)."""
    if not atime_works(tmp_path):
        pytest.skip("this filesystem does not record reads in the atime")
    outside = place(make_folder_stub(tmp_path), tmp_path)[1]
    age(outside)
    before = snapshot(outside)
    (outside / "victim.txt").read_text()
    assert snapshot(outside) != before


def make_folder_stub(tmp_path: Path) -> Path:
    d = tmp_path / "stub" / "2026-01-02-t"
    d.mkdir(parents=True)
    return d
