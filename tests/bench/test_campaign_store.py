"""The campaign folder on disk: atomic writes, the versioned manifest (typed, upgraded from v1, newer ones
refused), folder naming, finding the folder to resume, committing a run with the hashes of its files,
the raw-file check, and which files make up a (split) model."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.campaigns import store
from harness.campaigns.pagecache import evict_model_files, model_files
from harness.errors import UserError
from harness.formats.files import atomic_write_json
from harness.formats.manifest import (
    VERSION,
    RunRecord,
    load_manifest,
    raw_file_changes,
    save_manifest,
    unhashed_runs,
)
from harness.formats.manifest_migrate import migrate_folder
from harness.formats.metrics_csv import COLUMNS
from harness.formats.outcome import read_outcome
from tests.helpers.folders import manifest, outcome

REPO = Path(__file__).resolve().parents[2]
BENCH = [sys.executable, "-m", "harness.bench_cli"]


def test_atomic_write_leaves_only_the_file(tmp_path):
    p = tmp_path / "m.json"
    atomic_write_json(p, {"a": 1})
    atomic_write_json(p, {"a": 2})
    assert json.loads(p.read_text()) == {"a": 2}
    assert [x.name for x in tmp_path.iterdir()] == ["m.json"]


def test_manifest_format_and_version_are_checked(tmp_path):
    save_manifest(tmp_path, manifest())
    assert load_manifest(tmp_path).campaign.name == "t"
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "other", "version": 1}))
    with pytest.raises(UserError, match="not a bmoe-manifest file"):
        load_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest().dump(), "version": VERSION + 1}))
    with pytest.raises(UserError, match=f"manifest.json: manifest version {VERSION + 1} is newer than this "
                                        f"bmoe-bench understands \\({VERSION}\\); upgrade bmoe"):
        load_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{")
    with pytest.raises(UserError, match="not valid JSON"):
        load_manifest(tmp_path)
    with pytest.raises(UserError, match="no manifest.json"):
        load_manifest(tmp_path / "elsewhere")


def test_the_manifest_is_typed_and_refuses_unknown_keys(tmp_path):
    m = manifest().dump()
    m["runs"] = [{"run_id": "r01-c00", "round": 0, "cell": 0, "position": 0, "status": "pending", "colour": 1}]
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(UserError, match=r"manifest.json: runs\.0\.colour: Extra inputs are not permitted"):
        load_manifest(tmp_path)
    m["runs"] = [{"run_id": "r01-c00", "round": 0, "cell": 0, "position": 0, "status": "ok"}]
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(UserError, match=r"the record of a finished run \(ok\) lacks reason, start"):
        load_manifest(tmp_path)


def test_a_record_read_and_written_keeps_its_keys(tmp_path):
    pending = RunRecord(run_id="r01-c00", round=0, cell=0, position=0, status="pending")
    assert pending.dump() == {"run_id": "r01-c00", "round": 0, "cell": 0, "position": 0, "status": "pending"}
    done = pending.finish(outcome(), {"metrics.csv": "ab"})
    d = done.dump()
    assert list(d)[:6] == ["run_id", "round", "cell", "position", "status", "reason"] and d["reason"] is None
    assert d["sha256"] == {"metrics.csv": "ab"} and "previous_attempts" not in d
    again = done.model_copy(update={"status": "failed"}).retry()
    assert again.status == "pending" and again.previous_attempts[0].sha256 == {"metrics.csv": "ab"}
    assert again.dump()["previous_attempts"][0]["start"] == d["start"]


def test_a_v1_manifest_is_upgraded_in_memory_and_migrated_with_hashes(tmp_path):
    (tmp_path / "runs" / "r01-c00").mkdir(parents=True)
    (tmp_path / "runs" / "r01-c00" / "metrics.csv").write_text("x")
    rec = RunRecord(run_id="r01-c00", round=0, cell=0, position=0).finish(outcome(), {})
    v1 = {**manifest(runs=[rec]).dump(), "version": 1}
    del v1["runs"][0]["sha256"]
    (tmp_path / "manifest.json").write_text(json.dumps(v1, indent=1) + "\n")
    m = load_manifest(tmp_path)
    assert m.version == VERSION and m.upgraded_from == 1 and unhashed_runs(m) == ["r01-c00"]
    assert raw_file_changes(tmp_path, m) == []  # nothing recorded, nothing to compare
    assert json.loads((tmp_path / "manifest.json").read_text())["version"] == 1  # loading does not write
    assert migrate_folder(tmp_path) == (1, ["r01-c00"])
    m = load_manifest(tmp_path)
    assert m.upgraded_from is None and unhashed_runs(m) == []
    assert set(m.runs[0].sha256) == {"metrics.csv"}
    assert migrate_folder(tmp_path) == (VERSION, [])  # idempotent


def test_new_folder_is_dated_and_never_reused(tmp_path):
    t = 1_767_312_000.0  # 2026-01-02 00:00 UTC
    a = store.new_folder(tmp_path, "demo", t)
    b = store.new_folder(tmp_path, "demo", t)
    assert a.name == "2026-01-02-demo" and b.name == "2026-01-02-demo-2"
    assert (a / "runs").is_dir()


def test_find_resumable_wants_the_same_plan_and_an_unfinished_folder(tmp_path):
    for folder, m in (("2026-01-01-t", manifest(status="complete")),
                      ("2026-01-02-t", manifest(plan_hash="other")),
                      ("2026-01-03-t", manifest()),
                      ("2026-01-04-tt", manifest(name="tt"))):
        (tmp_path / folder).mkdir()
        save_manifest(tmp_path / folder, m)
    assert store.find_resumable(tmp_path, "t", "h1") == tmp_path / "2026-01-03-t"
    assert store.find_resumable(tmp_path, "t", "h2") is None
    assert store.find_resumable(tmp_path / "none", "t", "h1") is None


def test_commit_run_is_a_rename_and_hashes_every_file(tmp_path):
    (tmp_path / "runs").mkdir()
    tmp = store.tmp_run_dir(tmp_path, "r01-c00")
    tmp.mkdir()
    (tmp / "metrics.csv").write_text("x")
    o = outcome()
    hashes = store.commit_run(tmp_path, "r01-c00", o)
    final = tmp_path / "runs" / "r01-c00"
    assert final.is_dir() and not tmp.exists()
    assert read_outcome(final / "outcome.json") == o
    assert sorted(hashes) == ["metrics.csv", "outcome.json"]
    assert hashes["metrics.csv"] == "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"  # sha256("x")
    # a stale half-written run is cleared
    store.tmp_run_dir(tmp_path, "r01-c01").mkdir()
    assert store.clear_tmp(tmp_path) == [store.tmp_run_dir(tmp_path, "r01-c01").name]


def test_raw_file_changes_name_changed_missing_and_added_files(tmp_path):
    (tmp_path / "runs").mkdir()
    recs = []
    for rid in ("r01-c00", "r02-c00"):
        tmp = store.tmp_run_dir(tmp_path, rid)
        tmp.mkdir()
        (tmp / "metrics.csv").write_text("x")
        (tmp / "engine.log").write_text("log")
        recs.append(RunRecord(run_id=rid, round=0, cell=0, position=0).finish(
            outcome(), store.commit_run(tmp_path, rid, outcome())))
    m = manifest(runs=recs)
    assert raw_file_changes(tmp_path, m) == []
    (tmp_path / "runs" / "r01-c00" / "metrics.csv").write_text("y")
    (tmp_path / "runs" / "r02-c00" / "engine.log").unlink()
    (tmp_path / "runs" / "r02-c00" / "notes.txt").write_text("added")
    assert raw_file_changes(tmp_path, m) == ["runs/r01-c00/metrics.csv", "runs/r02-c00/engine.log",
                                             "runs/r02-c00/notes.txt"]


def test_model_files_of_a_split_model(tmp_path):
    first = tmp_path / "m-00001-of-00003.gguf"
    assert [p.name for p in model_files(first)] == [f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert model_files(tmp_path / "m.gguf") == [tmp_path / "m.gguf"]


def test_evict_reports_what_it_did(tmp_path):
    p = tmp_path / "m.gguf"
    p.write_bytes(os.urandom(1 << 16))
    r = evict_model_files(p)
    assert r["files"] == ["m.gguf"] and r["errors"] == []
    r = evict_model_files(tmp_path / "gone-00001-of-00002.gguf")
    assert r["files"] == [] and len(r["errors"]) == 2


# campaign folders with a written findings.md (a campaign still running has none yet)
COMMITTED = sorted(p.parent for p in (REPO / "bench-data").glob("*/manifest.json")
                   if '"bmoe-manifest"' in p.read_text(encoding="utf-8")[:200]
                   and (p.parent / "findings.md").is_file())


@pytest.mark.parametrize("folder", COMMITTED, ids=lambda p: p.name)
def test_committed_findings_match_their_raw_data(folder):
    from harness.report.build import check_report

    assert check_report(folder) == [], f"run: bmoe-bench report {folder.relative_to(REPO)}"
    assert unhashed_runs(load_manifest(folder)) == [], f"run: bmoe-bench report {folder.relative_to(REPO)} --migrate"


def test_check_names_an_edited_warm_up_row_of_a_committed_folder(tmp_path):
    """The trimmed warm-up token does not change the findings, so only the file hash can tell."""
    src = REPO / "bench-data" / "2026-11-30-demo"
    if not src.is_dir():
        pytest.skip("the demo campaign folder is not in this checkout")
    folder = tmp_path / src.name
    shutil.copytree(src, folder)
    csv = folder / "runs" / "r01-c00" / "metrics.csv"
    lines = csv.read_text().splitlines(keepends=True)
    first_row = next(i for i, ln in enumerate(lines) if ln.startswith("1,"))  # token 1: a warm-up token
    f = lines[first_row].split(",")
    w = COLUMNS.index("wall_ms")
    f[w] = f"{float(f[w]) * 2:.3f}"
    lines[first_row] = ",".join(f)
    csv.write_text("".join(lines))
    from harness.report.build import check_report

    assert check_report(folder) == ["runs/r01-c00/metrics.csv"]  # the findings themselves are unchanged
    r = subprocess.run([*BENCH, "report", str(folder), "--check"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and r.stderr.count("\n") == 1
    assert "runs/r01-c00/metrics.csv changed since the run was committed" in r.stderr


def test_cli_migrates_a_v1_folder_and_then_checks_its_files(tmp_path):
    src = REPO / "bench-data" / "2026-11-30-demo"
    if not src.is_dir():
        pytest.skip("the demo campaign folder is not in this checkout")
    folder = tmp_path / src.name
    shutil.copytree(src, folder)
    m = json.loads((folder / "manifest.json").read_text())
    for r in m["runs"]:
        del r["sha256"]
    (folder / "manifest.json").write_text(json.dumps({**m, "version": 1}, indent=1) + "\n")
    r = subprocess.run([*BENCH, "report", str(folder), "--check"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "6 run(s) have no recorded file hashes (manifest v1)" in r.stdout and "--migrate" in r.stdout
    r = subprocess.run([*BENCH, "report", str(folder), "--migrate", "--check"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"{folder}: manifest v1 -> v{VERSION}, raw-file hashes recorded for 6 run(s)" in r.stdout
    assert "raw files unchanged since committed" in r.stdout
    assert json.loads((folder / "manifest.json").read_text()) == json.loads((src / "manifest.json").read_text())
