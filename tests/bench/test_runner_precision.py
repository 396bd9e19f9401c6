"""Repeats driven by precision, with the fake engine as a real process: a campaign whose runs agree stops
after the minimum; one whose runs disagree goes on to the maximum; the findings say which; the key is
validated with the rest of the campaign file, hashed into the plan, set with --set, and resumable."""

from __future__ import annotations

import re
import shutil
import subprocess
from io import StringIO

import pytest
from rich.console import Console

from harness.campaigns.runner import plan_record, run_campaign
from harness.campaigns.validate import plan_campaign
from harness.campaigns.yamlsrc import CampaignError
from harness.formats.manifest import load_manifest, plan_hash, run_dir, save_manifest
from harness.formats.results_csv import read_results
from harness.report.build import build_report, check_report, write_report
from harness.report.checker import check_folder
from tests.helpers.runner import BENCH, campaign


def precise_campaign(tmp_path, *, noise: float, rule: str, repeats: int | None = None):
    p = campaign(tmp_path, repeats=2, tokens=5)
    text = p.read_text().replace("--sleep-ms: 0}", f"--sleep-ms: 0, --noise: {noise}}}")
    text = text.replace("repeats: 2\n", f"repeats: {repeats}\n" if repeats else "")
    p.write_text(text + f"precision: {rule}\n")
    return p


def _console() -> tuple[Console, StringIO]:
    buf = StringIO()
    return Console(file=buf, width=200), buf


def test_runs_that_agree_stop_after_the_minimum(tmp_path):
    p = precise_campaign(tmp_path, noise=0.0, rule="{ratio_half_width: 0.05, min_repeats: 3, max_repeats: 6}")
    con, out = _console()
    res = run_campaign(p, root=tmp_path / "bd", console=con)
    m = load_manifest(res.folder)
    assert m.status == "complete" and res.n_ok == 6 and len(m.runs) == 6  # 3 rounds x 2 cells, no more
    assert m.campaign.repeats == 3 and m.campaign.precision.max_repeats == 6
    assert "after round 3: 1/1 ratios within +-5% (at 99%)" in out.getvalue() and "precise: stopping" in out.getvalue()
    write_report(res.folder)
    md = (res.folder / "findings.md").read_text()
    assert "stopped after 3 rounds: every ratio reached the precision" in md
    assert "| --speed=20 | 2.00x [2.00, 2.00] | +-0.0% (at 99%) | yes |" in md
    assert "3 rounds (repeats driven by precision: 3 to 6, until every ratio is within +-5%)" in md
    version, rows = read_results(res.folder / "results.csv")
    assert version == 2
    assert rows[1]["ratio_method"] == "paired t over rounds, t at 99%: the campaign stopped once precise"
    assert check_report(res.folder) == []
    checked = check_folder(res.folder)  # bmoe-bench check names the precision outcome
    assert checked.ok and "precision +-5%, 3-6 rounds: every ratio reached it after 3 rounds" in checked.notes


def test_runs_that_disagree_go_on_to_the_maximum_and_say_so(tmp_path):
    p = precise_campaign(tmp_path, noise=0.3, rule="{ratio_half_width: 0.05, min_repeats: 2, max_repeats: 4}")
    con, out = _console()
    res = run_campaign(p, root=tmp_path / "bd", console=con)
    m = load_manifest(res.folder)
    assert m.status == "complete" and len(m.runs) == 8 and res.n_ok == 8
    assert [r.run_id for r in m.runs[4:]] == ["r03-c00", "r03-c01", "r04-c01", "r04-c00"]  # alternating continues
    assert [r.position for r in m.runs] == list(range(8))
    text = out.getvalue()
    assert text.count("adding a round") == 2 and "after round 4: 0/1 ratios within +-5%" in text
    assert "the maximum: stopping" in text
    md = build_report(res.folder, with_plots=False).texts["findings.md"]
    assert "stopped at the maximum, 4 rounds" in md and "| no: stopped at the maximum |" in md
    checked = check_folder(res.folder)  # (its fast fake runs are under check's minimum wall time: not this test's)
    assert not [q for q in checked.problems if q.startswith("precision")]
    assert any(n.startswith("precision +-5%, 2-4 rounds: stopped at the maximum, 4 rounds") for n in checked.notes)
    ratio = re.search(r"\| --speed=20 \| 4/4 \| [0-9.]+ \[[0-9.]+, [0-9.]+\] \| ([0-9.]+) \[([0-9.]+), ([0-9.]+)\]", md)
    point, lo, hi = map(float, ratio.groups())
    assert hi / point - 1 > 0.05  # a plain 95% interval (not stopped on precision), wider than the target


def test_a_cell_whose_runs_all_fail_stops_the_rounds_and_says_so(tmp_path):
    """Without the rule a cell that fails every run kept rounds coming to the maximum (roofline-500m's first run)."""
    p = campaign(tmp_path, repeats=2, tokens=5, fail_axis=True)
    p.write_text(p.read_text() + "precision: {ratio_half_width: 0.05, max_repeats: 8}\n")
    con, out = _console()
    res = run_campaign(p, root=tmp_path / "bd", console=con)
    m = load_manifest(res.folder)
    assert len(m.runs) == 6 and all(r.finished for r in m.runs)  # 2 rounds of 3 cells, not 8
    assert [r.status for r in m.runs if r.cell == 2] == ["failed", "failed"]
    text = out.getvalue()
    assert "after round 2:" in text and "a cell has no usable run (its runs failed): stopping" in text
    assert "adding a round" not in text
    md = build_report(res.folder, with_plots=False).texts["findings.md"]
    assert "stopped after 2 rounds: a cell had no usable run" in md
    assert "| no: stopped, a cell had no usable run |" in md
    checked = check_folder(res.folder)
    assert not [q for q in checked.problems if q.startswith("precision")]
    assert any("stopped after 2 rounds because a cell had no usable run" in n for n in checked.notes)


def test_a_campaign_cut_after_a_round_resumes_and_decides_again(tmp_path):
    p = precise_campaign(tmp_path, noise=0.3, rule="{ratio_half_width: 0.05, min_repeats: 2, max_repeats: 3}")
    root = tmp_path / "bd"
    res = run_campaign(p, root=root, console=_console()[0])
    m = load_manifest(res.folder)
    assert len(m.runs) == 6
    # as if killed after round 2's last run was committed, before the decision added round 3
    for r in m.runs[4:]:
        shutil.rmtree(run_dir(res.folder, r.run_id))
    m.runs = m.runs[:4]
    m.status = "running"
    save_manifest(res.folder, m)
    assert "precision +-5%, 2-3 rounds: not decided after 2 rounds (runs pending or rounds missing); resume the " \
        "campaign" in check_folder(res.folder).problems
    con, out = _console()
    again = run_campaign(p, root=root, console=con)
    assert again.folder == res.folder and again.n_skipped == 4 and again.n_ok == 6
    m2 = load_manifest(res.folder)
    assert m2.status == "complete" and [r.run_id for r in m2.runs] == [r.run_id for r in m.runs] + [
        "r03-c00", "r03-c01"]
    assert "after round 2: 0/1" in out.getvalue() and "after round 3: 0/1" in out.getvalue()


def test_precision_is_in_the_plan_hash_and_set_from_the_command_line(tmp_path):
    p = campaign(tmp_path, repeats=2)
    plain = plan_record(plan_campaign(p))
    assert "precision" not in plain.dump()  # absent without it: older plans hash as before
    sets = ["precision.ratio_half_width=0.1"]
    plan = plan_campaign(p, overrides=sets)
    rec = plan_record(plan)
    assert rec.precision.ratio_half_width == 0.1 and rec.precision.min_repeats == 2 and rec.precision.max_repeats == 12
    assert len(plan.runs) == 4 and plan_hash(rec) != plan_hash(plain)
    assert plan_hash(plan_record(plan_campaign(p, overrides=["precision.ratio_half_width=0.2"]))) != plan_hash(rec)
    r = subprocess.run([*BENCH, "validate", str(p), "--set", sets[0]], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "2 cells x 2 repeats = 4 runs of 6 tokens, then whole rounds until every ratio is within +-10% " \
           "(at most 12)" in r.stdout


@pytest.mark.parametrize("rule,repeats,message", [
    ("{ratio_half_width: 0.05, min_repeats: 3}", 2, "precision.min_repeats (3) and repeats (2) disagree"),
    ("{ratio_half_width: 0.05, max_repeats: 2}", 3, "precision.max_repeats (2) is below the minimum (3 rounds)"),
    ("{ratio_half_width: 0.05}", 1, "precision needs at least 2 rounds before its first check, got 1"),
    ("{ratio_half_width: 0}", 3, "ratio_half_width"),
    ("{ratio_halfwidth: 0.05}", 3, "did you mean 'ratio_half_width'"),
    ("{min_repeats: 3}", None, "missing key 'ratio_half_width' in precision"),
    ("0.05", 3, "precision must be a mapping"),
])
def test_precision_mistakes_name_the_line(tmp_path, rule, repeats, message):
    p = precise_campaign(tmp_path, noise=0.0, rule=rule, repeats=repeats)
    with pytest.raises(CampaignError) as e:
        plan_campaign(p)
    assert any(line.startswith(f"{p}:") and message in line for line in e.value.lines), e.value.lines
