"""What goes wrong: a campaign file with problems (all listed at once), a run that fails (recorded with
its reason while the rest go on), and --retry-failed (only the failed runs again, old records kept)."""

import subprocess

from harness.campaigns.runner import run_campaign
from harness.formats.manifest import load_manifest
from tests.helpers.runner import BENCH, campaign, quiet


def test_cli_validate_lists_every_problem(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\nmodel: {path: m}\nrepeat: 2\ntokens: many\n")
    r = subprocess.run([*BENCH, "validate", str(p)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert lines[0] == f"{p}:3: unknown key 'repeat' (did you mean 'repeats'?)"
    assert lines[1].startswith(f"{p}:4: tokens must be an integer")
    assert lines[-1] == f"Error: {p}: 2 problems (listed above)"


def test_failed_run_is_recorded_and_the_rest_continue(tmp_path):
    p = campaign(tmp_path, fail_axis=True, repeats=1)
    r = subprocess.run([*BENCH, "run", str(p), "--out", str(tmp_path / "bd")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1, r.stderr
    assert "1 of 3 runs failed" in r.stderr and "--retry-failed" in r.stderr
    (folder,) = (tmp_path / "bd").iterdir()
    m = load_manifest(folder)
    by_cell = {x.cell: x for x in m.runs}
    assert by_cell[2].status == "failed"
    assert by_cell[2].reason == "engine exited 3: fake-engine: failing on purpose with 3"
    assert by_cell[2].exit_code == 3 and by_cell[2].tokens is None
    assert sorted(by_cell[2].sha256) == ["engine.log", "outcome.json", "state.jsonl"]  # no CSV, all hashed
    assert by_cell[0].status == by_cell[1].status == "ok"
    findings = (folder / "findings.md").read_text()
    assert "failed: engine exited 3" in findings


def test_retry_failed_runs_only_the_failed_ones(tmp_path):
    p = campaign(tmp_path, fail_axis=True, repeats=1)
    res = run_campaign(p, root=tmp_path / "bd", console=quiet())
    assert res.n_failed == 1
    before = {r.run_id: r for r in load_manifest(res.folder).runs}
    res2 = run_campaign(p, root=tmp_path / "bd", console=quiet(), retry_failed=True)
    assert res2.folder == res.folder and res2.n_failed == 1  # it fails again, on purpose
    m = load_manifest(res.folder)
    failed = next(r for r in m.runs if r.status == "failed")
    (prev,) = failed.previous_attempts
    assert prev.start == before[failed.run_id].start and prev.sha256 == before[failed.run_id].sha256
    assert failed.start != prev.start
    assert all(r.start == before[r.run_id].start for r in m.runs if r.status == "ok")
