"""The campaign folder on disk: atomic writes, the versioned manifest, folder naming, finding the folder
to resume, and which files make up a (split) model."""

import json
import os
from pathlib import Path

import pytest

from harness.campaigns import store
from harness.campaigns.pagecache import evict_model_files, model_files
from harness.errors import UserError


def manifest(name="t", plan_hash="h1", status="running"):
    return {"format": store.FORMAT, "version": store.VERSION, "campaign": {"name": name},
            "plan_hash": plan_hash, "status": status, "runs": []}


def test_atomic_write_leaves_only_the_file(tmp_path):
    p = tmp_path / "m.json"
    store.atomic_write_json(p, {"a": 1})
    store.atomic_write_json(p, {"a": 2})
    assert json.loads(p.read_text()) == {"a": 2}
    assert [x.name for x in tmp_path.iterdir()] == ["m.json"]


def test_manifest_format_and_version_are_checked(tmp_path):
    store.save_manifest(tmp_path, manifest())
    assert store.load_manifest(tmp_path)["campaign"]["name"] == "t"
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "other", "version": 1}))
    with pytest.raises(UserError, match="not a bmoe-manifest file"):
        store.load_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{")
    with pytest.raises(UserError, match="not valid JSON"):
        store.load_manifest(tmp_path)
    with pytest.raises(UserError, match="no manifest.json"):
        store.load_manifest(tmp_path / "elsewhere")


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
        store.save_manifest(tmp_path / folder, m)
    assert store.find_resumable(tmp_path, "t", "h1") == tmp_path / "2026-01-03-t"
    assert store.find_resumable(tmp_path, "t", "h2") is None
    assert store.find_resumable(tmp_path / "none", "t", "h1") is None


def test_commit_run_is_a_rename(tmp_path):
    (tmp_path / "runs").mkdir()
    tmp = store.tmp_run_dir(tmp_path, "r01-c00")
    tmp.mkdir()
    (tmp / "metrics.csv").write_text("x")
    final = store.commit_run(tmp_path, "r01-c00", {"status": "ok"})
    assert final == tmp_path / "runs" / "r01-c00" and not tmp.exists()
    assert json.loads((final / "outcome.json").read_text()) == {"status": "ok"}
    # a stale half-written run is cleared
    store.tmp_run_dir(tmp_path, "r01-c01").mkdir()
    assert store.clear_tmp(tmp_path) == [".r01-c01.tmp"]


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


REPO = Path(__file__).resolve().parent.parent
# campaign folders with a written findings.md (a campaign still running has none yet)
COMMITTED = sorted(p.parent for p in (REPO / "bench-data").glob("*/manifest.json")
                   if '"bmoe-manifest"' in p.read_text(encoding="utf-8")[:200]
                   and (p.parent / "findings.md").is_file())


@pytest.mark.parametrize("folder", COMMITTED, ids=lambda p: p.name)
def test_committed_findings_match_their_raw_data(folder):
    from harness.report.build import check_report

    assert check_report(folder) == [], f"run: bmoe-bench report {folder.relative_to(REPO)}"
