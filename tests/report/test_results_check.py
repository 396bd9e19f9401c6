"""`bmoe-bench check` (harness.report.checker): over every committed campaign folder, and on copies of one
with a problem planted: one line per problem, exit status 1."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.report.checker import ACKNOWLEDGED, MIN_KEPT_TOKENS, check_folder
from tests.helpers.runner import BENCH

REPO = Path(__file__).resolve().parents[2]
COMMITTED = sorted(p.parent for p in (REPO / "bench-data").glob("*/manifest.json")
                   if '"bmoe-manifest"' in p.read_text(encoding="utf-8")[:200]
                   and (p.parent / "findings.md").is_file())
DEMO = REPO / "bench-data" / "2026-11-30-demo"


@pytest.mark.parametrize("folder", COMMITTED, ids=lambda p: p.name)
def test_every_committed_folder_passes_the_check(folder):
    res = check_folder(folder)
    assert res.problems == [], f"bmoe-bench check {folder.relative_to(REPO)}: " + " | ".join(res.problems)


def test_the_guess_ahead_bug_is_found_and_acknowledged_not_hidden():
    folder = REPO / "bench-data" / "2026-12-01-guess-ahead"
    res = check_folder(folder)
    assert res.ok and len([n for n in res.notes if n.startswith(f"acknowledged ({ACKNOWLEDGED})")]) == 6
    assert (folder / "findings.md").read_text().startswith("**LOSSLESS AUDIT FAILED**: lossless cell 'ngram-d2'")


def _copy(tmp_path: Path) -> Path:
    folder = tmp_path / DEMO.name
    shutil.copytree(DEMO, folder)
    return folder


def test_planted_problems_one_line_each(tmp_path):
    folder = _copy(tmp_path)
    csv = folder / "runs" / "r01-c01" / "metrics.csv"
    csv.write_text("".join(ln for ln in csv.read_text().splitlines(keepends=True) if not ln.startswith("# summary")))
    m = json.loads((folder / "manifest.json").read_text())
    m["runs"][2].update(status="failed", reason=None)  # a failed run nobody explained
    (folder / "manifest.json").write_text(json.dumps(m))
    (folder / ACKNOWLEDGED).write_text("# stale\nrun r09-c09 has not run\n")
    res = check_folder(folder)
    rid = m["runs"][2]["run_id"]
    assert rid != "r01-c01" and res.problems == [
        "run r01-c01: runs/r01-c01/metrics.csv: no '# summary' line (the file was truncated, or the engine did not "
        "finish)",
        f"run {rid} failed without a recorded reason",
        "runs/r01-c01/metrics.csv changed since its run was committed (sha256 in manifest.json)",
        f"{ACKNOWLEDGED}:2: 'run r09-c09 has not run' no longer occurs: remove it",
    ]
    r = subprocess.run([*BENCH, "check", str(folder), str(DEMO)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    err = r.stderr.splitlines()
    assert err[:4] == [f"{folder}: {p}" for p in res.problems]
    assert err[4] == "Error: 1 of 2 folder(s) failed the check (problems listed above)"
    assert f"{DEMO}: ok" in r.stdout


def test_a_run_too_short_to_time_and_a_missing_cell(tmp_path):
    folder = _copy(tmp_path)
    m = json.loads((folder / "manifest.json").read_text())
    m["campaign"]["warmup_tokens"] = m["campaign"]["tokens"] - MIN_KEPT_TOKENS + 1
    gone = m["campaign"]["cells"][1]["index"]
    m["runs"] = [r for r in m["runs"] if r["cell"] != gone]
    (folder / "manifest.json").write_text(json.dumps(m))
    problems = check_folder(folder).problems
    assert problems[0] == f"cell {gone} ('{m['campaign']['cells'][1]['label']}') has no run in the manifest"
    assert problems[1].startswith("planned runs not in the manifest: ")
    assert all(p.endswith(f"fewer than {MIN_KEPT_TOKENS}") for p in problems[2:]) and len(problems) > 2


def test_check_of_something_that_is_not_a_campaign(tmp_path):
    r = subprocess.run([*BENCH, "check", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and f"{tmp_path}: {tmp_path}: no manifest.json" in r.stderr


def test_a_cell_whose_every_run_failed_has_no_result(tmp_path, monkeypatch):
    from harness.campaigns.runner import run_campaign
    from tests.helpers.runner import campaign, quiet

    monkeypatch.setenv("BMOE_HASH_CACHE", str(tmp_path / "hashes.json"))
    res = run_campaign(campaign(tmp_path, fail_axis=True), root=tmp_path / "bd", console=quiet())
    assert res.n_failed == 2
    problems = check_folder(res.folder).problems
    assert problems == ["cell 2 ('--fail=3'): every run failed, so it has no result"], problems
