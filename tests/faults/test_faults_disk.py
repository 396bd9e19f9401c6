"""Disk full at every write stage, on a real 3 MiB tmpfs filled up at the right moment: one line naming the
path and the space, exit 28, no hang (the engine's output is always drained), resumable once space is freed,
nothing finished lost; `report --check` sees missing or cut plots and leftover temporary files."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.faults import (
    bench,
    check_ok,
    cli,
    copy_of,
    done_campaign,
    error_line,
    fill,
    folders,
    held,
    in_flight,
    manifest_runs,
    mount_tmpfs,
    start,
)
from tests.helpers.runner import campaign, finished, wait_for


@pytest.fixture
def tmpfs(tmp_path):
    yield from mount_tmpfs(tmp_path)


@pytest.fixture(scope="module")
def done_folder(tmp_path_factory) -> Path:
    return done_campaign(tmp_path_factory.mktemp("done"))


@pytest.fixture
def copy(done_folder, tmp_path) -> Path:
    return copy_of(done_folder, tmp_path)


# ---- 2. disk full at every write stage --------------------------------------------------------------------------

def test_disk_full_while_the_engine_runs_is_one_line_then_resumable(tmp_path, tmpfs):
    p, gate = held(tmp_path, repeats=2, tokens=8)
    out = tmpfs / "bd"
    a = start("run", p, "--out", out)
    folder = wait_for(lambda: (folders(out) or [None])[0], timeout=120)
    wait_for(lambda: in_flight(folder), timeout=120)
    gate.touch()
    wait_for(lambda: finished(folder), timeout=120)
    gate.unlink()
    wait_for(lambda: in_flight(folder), timeout=120)  # the second run, waiting after its first token
    kept = {k: v["start"] for k, v in manifest_runs(folder).items() if v["status"] != "pending"}
    filler = fill(tmpfs)
    gate.touch()  # it goes on: 7 more progress lines to a log on a full disk
    t0 = time.monotonic()
    _, err = a.communicate(timeout=120)
    assert time.monotonic() - t0 < 60  # no hang until the campaign timeout
    assert a.returncode == 28, err
    line = error_line(err)
    assert "disk full" in line and str(tmpfs) in line and f"--out {out}" in line, line
    filler.unlink()
    r = bench("run", p, "--out", out)
    assert r.returncode == 0, r.stderr
    assert folders(out) == [folder]
    runs = manifest_runs(folder)
    assert all(r["status"] == "ok" for r in runs.values())
    assert all(runs[k]["start"] == s for k, s in kept.items())  # nothing finished lost or redone
    check_ok(folder)


def test_an_engine_failing_on_a_full_disk_stops_the_campaign_resumable(tmp_path, tmpfs, monkeypatch):
    """The engine's own CSV (under TMPDIR, full) cannot be written: a full disk, not a failed run."""
    import tempfile

    p = campaign(tmp_path, repeats=1, tokens=300)  # a CSV of ~40 KiB
    out = tmp_path / "bd"
    monkeypatch.setenv("TMPDIR", str(tmpfs))
    monkeypatch.setattr(tempfile, "tempdir", None)
    filler = fill(tmpfs, leave=8192)  # room for tempfile's probe, not for the CSV
    r = cli("run", p, "--out", out)
    assert r.returncode == 28, r.stderr
    line = error_line(r.stderr)
    assert f"{tmpfs}" in line and "disk full" in line, line
    (folder,) = folders(out)
    assert all(x["status"] == "pending" for x in manifest_runs(folder).values())  # no run recorded as failed
    filler.unlink()
    r = cli("run", p, "--out", out)
    assert r.returncode == 0, r.stderr
    check_ok(folder)


def test_disk_full_in_the_engine_log_never_blocks_the_engine(tmp_path, tmpfs):
    """The engine writes 4 MiB to stdout after the disk is full: the pipe is still drained."""
    from harness.formats.files import DiskFull
    from harness.targets.local import LocalTarget

    fill(tmpfs)
    argv = [sys.executable, "-c", "import sys\nfor i in range(4096): sys.stdout.write('x' * 1023 + '\\n')"]
    t0 = time.monotonic()
    with pytest.raises(DiskFull, match="engine.log: disk full"):
        LocalTarget().run(argv, timeout_s=60, outputs=[], out_dir=tmp_path, log_path=tmpfs / "engine.log")
    assert time.monotonic() - t0 < 20


def test_disk_full_fetching_the_engine_csv(tmp_path, tmpfs):
    from harness.formats.files import DiskFull
    from harness.targets.local import LocalTarget

    csv = tmp_path / "r.csv"
    argv = [sys.executable, "-c", f"open({str(csv)!r}, 'w').write('x' * 200000)"]
    fill(tmpfs, leave=8192)
    with pytest.raises(DiskFull, match=r"r\.csv: disk full \(needs 0\.2 MiB"):
        LocalTarget().run(argv, timeout_s=60, outputs=[str(csv)], out_dir=tmpfs, log_path=tmp_path / "log")
    assert not (tmpfs / "r.csv").exists()  # no partial copy


def test_disk_full_committing_a_run_and_the_manifest(copy, tmp_path, tmpfs):
    from harness.campaigns import store
    from harness.formats.files import DiskFull
    from harness.formats.manifest import load_manifest, save_manifest
    from harness.formats.outcome import read_outcome

    folder = tmpfs / copy.name
    shutil.copytree(copy, folder)
    m = load_manifest(folder)
    before = (folder / "manifest.json").read_bytes()
    o = read_outcome(folder / "runs" / "r01-c00" / "outcome.json")
    tmp = store.tmp_run_dir(folder, "r01-c00")
    tmp.mkdir()
    fill(tmpfs)
    with pytest.raises(DiskFull, match="outcome.json: disk full"):
        store.commit_run(folder, "r01-c00", o)
    m.status = "running"
    with pytest.raises(DiskFull, match="manifest.json: disk full"):
        save_manifest(folder, m)
    assert (folder / "manifest.json").read_bytes() == before  # the old one, whole
    assert (folder / "runs" / "r01-c00" / "outcome.json").is_file()  # the committed run untouched
    assert store.clear_tmp(folder) == [tmp.name]  # only the half-written run, no stray temp file


def test_disk_full_when_starting_a_campaign_leaves_no_half_folder(tmp_path, tmpfs):
    p = campaign(tmp_path, repeats=1)
    out = tmpfs / "bd"
    out.mkdir()
    filler = fill(tmpfs)
    r = cli("run", p, "--out", out)
    assert r.returncode == 28, r.stderr
    assert "disk full" in error_line(r.stderr)
    assert [d.name for d in out.iterdir()] == []
    filler.unlink()
    r = cli("run", p, "--out", out)
    assert r.returncode == 0, r.stderr
    check_ok(folders(out)[0])


def test_disk_full_writing_the_report_and_check_sees_missing_plots(copy, tmpfs):
    folder = tmpfs / copy.name
    shutil.copytree(copy, folder)
    shutil.rmtree(folder / "plots")
    filler = fill(tmpfs, leave=24 * 1024)  # findings.md and results.csv fit, the plots do not
    r = cli("report", folder)
    assert r.returncode == 28
    assert "disk full" in error_line(r.stderr)
    leftovers = [p.name for p in folder.rglob(".*") if p.name.endswith(".tmp")]
    assert leftovers == []
    r = cli("report", folder, "--check")
    assert r.returncode == 2 and "plots/" in error_line(r.stderr)
    filler.unlink()
    assert cli("report", folder).returncode == 0
    check_ok(folder)


def test_report_check_flags_a_stray_temp_file_and_a_cut_plot(copy):
    (copy / "plots" / ".split.png.tmp").write_bytes(b"\x89PNG")
    png = copy / "plots" / "tokens.png"
    png.write_bytes(png.read_bytes()[:1000])
    r = cli("report", copy, "--check")
    assert r.returncode == 2
    line = error_line(r.stderr)
    assert "plots/.split.png.tmp" in line and "plots/tokens.png" in line, line
