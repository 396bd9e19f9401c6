"""Campaign-folder faults of issue 23 beyond crafted paths: a run's sha256 entry removed (item 4), a renamed copy
(item 5), read-only folders and a file as --out (item 16), the "folder busy" kill hint (item 17), the lock files
opened without following a link (item 2) and a retried run's failed attempt kept (item 20)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.campaigns.store import FolderBusy, FolderLock
from harness.errors import UserError
from harness.formats.manifest import load_manifest
from tests.helpers.hostile import REPO, Base, forked, make_base, one_line_refusal, spawn
from tests.helpers.runner import engine, wait_for


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Base:
    return make_base(tmp_path_factory.mktemp("folder-faults"))


def _copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


# ---- item 4: a finished run without its sha256 in a v2+ manifest fails the check ----------------------------------

def test_a_removed_sha256_entry_is_a_check_failure_not_a_note(base, tmp_path):
    folder = _copy(base.complete, tmp_path / "bd" / base.complete.name)
    m = json.loads((folder / "manifest.json").read_text())
    run = m["runs"][0]
    del run["sha256"]  # switches that run's tamper check off ...
    (folder / "manifest.json").write_text(json.dumps(m, indent=1) + "\n")
    csv = folder / "runs" / run["run_id"] / "metrics.csv"  # ... and its CSV is then edited: a faster first token
    lines = csv.read_text().splitlines(keepends=True)
    row = next(i for i, x in enumerate(lines) if x.startswith("1,"))
    cols = lines[row].split(",")
    cols[2] = f"{float(cols[2]) / 5:.3f}"  # step,steps,wall_ms,...
    lines[row] = ",".join(cols)
    csv.write_text("".join(lines))
    for argv in (["report", str(folder), "--check"], ["check", str(folder)]):
        line = one_line_refusal(forked(argv, tmp_path))
        assert f"run(s) {run['run_id']} have no sha256 in manifest.json" in line and "removed" in line, line
    line = one_line_refusal(forked(["report", str(folder), "--migrate"], tmp_path))  # hashing it now would launder it
    assert "removed" in line and json.loads((folder / "manifest.json").read_text()) == m


def test_a_file_saying_v1_but_holding_later_fields_is_not_legacy(base, tmp_path):
    folder = _copy(base.complete, tmp_path / base.complete.name)
    m = json.loads((folder / "manifest.json").read_text())
    del m["runs"][1]["sha256"]
    (folder / "manifest.json").write_text(json.dumps({**m, "version": 1}, indent=1) + "\n")
    line = one_line_refusal(forked(["check", str(folder)], tmp_path))
    assert f"run(s) {m['runs'][1]['run_id']} have no sha256" in line


# ---- item 5: a copied and renamed folder passes --check ---------------------------------------------------------

def test_a_renamed_copy_elsewhere_passes_report_check(base, tmp_path):
    folder = _copy(base.complete, tmp_path / "audit" / "copied-by-a-reviewer")
    r = spawn(["report", str(folder), "--check"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert base.complete.name not in (folder / "findings.md").read_text()


# ---- item 16: read-only folders and a file as --out: one line -----------------------------------------------------

def _no_dac() -> tuple[str, ...]:
    """A prefix that makes root obey file permissions (else a read-only folder is writable to it)."""
    if os.geteuid() != 0:
        return ()
    caps = "-dac_override,-dac_read_search"
    return ("setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}")


def test_report_on_a_read_only_folder_is_one_line(base, tmp_path):
    folder = _copy(base.complete, tmp_path / base.complete.name)
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    os.chmod(folder, 0o555)
    try:
        line = one_line_refusal(spawn(["report", str(folder)], tmp_path, prefix=_no_dac()))
    finally:
        os.chmod(folder, 0o755)
    assert line == (f"Error: {folder}: cannot write findings.md there (Permission denied); make the folder "
                    f"writable, or copy it somewhere you can write and run the command there")
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before


def test_run_into_a_read_only_directory_is_one_line(base, tmp_path):
    out = tmp_path / "ro"
    out.mkdir(mode=0o555)
    line = one_line_refusal(spawn(["run", str(base.yaml), "--out", str(out)], tmp_path, prefix=_no_dac()))
    assert line.startswith(f"Error: {out}/.t.lock: cannot create the lock file there (Permission denied)")
    below = out / "deeper"
    line = one_line_refusal(spawn(["run", str(base.yaml), "--out", str(below)], tmp_path, prefix=_no_dac()))
    assert line.startswith(f"Error: {below}: cannot create this folder (Permission denied)")
    assert os.listdir(out) == []


def test_out_naming_a_file_is_one_line(base, tmp_path):
    f = tmp_path / "a-file"
    f.write_text("keep me\n")
    line = one_line_refusal(forked(["run", str(base.yaml), "--out", str(f)], tmp_path))
    assert line == f"Error: {f}: a file, not a folder; campaign folders go under a folder (--out DIR)"
    assert f.read_text() == "keep me\n"


# ---- item 17: the "folder busy" hint is a working command ---------------------------------------------------------

HOLD = """
import sys, time
from pathlib import Path
from harness.campaigns.store import lock_folder
lock = lock_folder(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(300)
"""


def test_the_folder_busy_hint_kills_the_holder(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              cwd=REPO)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(FolderBusy) as e:
            FolderLock(tmp_path / ".lock", str(tmp_path))
        hint = re.search(r"stop it \((kill [^)]*)\)", str(e.value))
        assert hint is not None and hint.group(1) == f"kill {holder.pid}", str(e.value)
        assert subprocess.run(hint.group(1), shell=True).returncode == 0  # the command as printed works
        assert wait_for(lambda: holder.poll() is not None, timeout=10)
        assert holder.returncode == -signal.SIGTERM
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


# ---- item 2: the lock files are never opened through a link --------------------------------------------------------

@pytest.mark.parametrize("name", [".lock", ".t.lock"])
def test_a_lock_file_that_is_a_link_is_refused_and_its_target_untouched(tmp_path, name):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / name).symlink_to(victim)
    with pytest.raises(UserError, match=f"{name}: a symbolic link where bmoe-bench keeps its lock file; refused"):
        FolderLock(tmp_path / "d" / name, "x")
    assert victim.read_text() == "precious\n" and (tmp_path / "d" / name).is_symlink()


def test_a_half_made_start_that_is_a_link_is_unlinked_not_followed(tmp_path):
    from harness.campaigns.store import clear_stale_starts

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious\n")
    root = tmp_path / "bd"
    root.mkdir()
    (root / ".2026-01-02-t.999999.tmp").symlink_to(victim)
    assert clear_stale_starts(root, "t") == [".2026-01-02-t.999999.tmp"]
    assert os.listdir(root) == [] and (victim / "keep.txt").read_text() == "precious\n"


# ---- item 20: --retry-failed keeps the failed attempt's files -------------------------------------------------------

def test_a_retried_run_keeps_its_failed_attempt_beside_it(tmp_path):
    """An engine that fails until a flag file exists: the first session fails every run, the retry succeeds;
    runs/<id>/attempt-1/ keeps the failed attempt's engine.log (hashed with the run), and the folder passes
    `report --check` and `check`."""
    fake = engine(tmp_path)
    flag = tmp_path / "fixed"
    exe = tmp_path / "flaky-engine"
    exe.write_text(f"#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = --version ] && exec {fake} --version; done\n"
                   f"[ -e {flag} ] || {{ echo 'flaky: not fixed yet' >&2; exit 3; }}\nexec {fake} \"$@\"\n")
    exe.chmod(0o755)
    model = tmp_path / "model.bin"
    model.write_bytes(b"\0" * 4096)
    yaml = tmp_path / "t.yaml"
    yaml.write_text(f"name: t\nmodel: {{path: {model}}}\nengine: {{kind: external, path: {exe}}}\n"
                    "flags: {--speed: 10}\nrepeats: 1\ntokens: 6\nwarmup_tokens: 1\n"
                    "cooldown: {mem_available_min_mib: 64, max_wait_s: 5}\ntimeout_s: 60\n"
                    "axes:\n  - flag: --speed\n    values: [20]\n")
    out = tmp_path / "bd"
    r = spawn(["run", str(yaml), "--out", str(out)], tmp_path)
    assert r.returncode == 1 and "--retry-failed" in r.stderr, r.stderr
    (folder,) = out.iterdir()
    first = {x.run_id: x for x in load_manifest(folder).runs}
    flag.write_text("")
    r = forked(["run", str(yaml), "--out", str(out), "--retry-failed"], tmp_path)
    assert r.returncode == 0, r.stderr
    m = load_manifest(folder)
    for run in m.runs:
        d = folder / "runs" / run.run_id
        assert run.status == "ok" and run.previous_attempts[0].start == first[run.run_id].start
        assert (d / "attempt-1" / "engine.log").read_text().startswith("flaky: not fixed yet")
        assert sorted(run.previous_attempts[0].sha256 or {}) == sorted(
            p.relative_to(d / "attempt-1").as_posix() for p in (d / "attempt-1").rglob("*") if p.is_file())
        assert "attempt-1/engine.log" in (run.sha256 or {})  # kept, and tamper-evident with the run
    for argv in (["report", str(folder), "--check"], ["check", str(folder)]):
        r = forked(argv, tmp_path)
        assert r.returncode == 0, r.stderr
    (folder / "runs" / m.runs[0].run_id / "attempt-1" / "engine.log").write_text("rewritten\n")
    line = one_line_refusal(forked(["report", str(folder), "--check"], tmp_path))
    assert f"runs/{m.runs[0].run_id}/attempt-1/engine.log changed since the run was committed" in line
