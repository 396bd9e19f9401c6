"""Grades, statistics and findings of a quality campaign folder built from fixture replies with known
answers; `bmoe-bench grade` and `report --check` over them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.bench_cli import main
from harness.errors import UserError
from harness.formats.grades import GRADES_FILE, read_grades
from harness.formats.manifest import QualityRecord, RunRecord, hash_files, run_dir, save_manifest
from harness.formats.metrics_csv import MetricsWriter, Summary, TokenRow
from harness.formats.replies import REPLIES_FILE, RepliesWriter, Reply
from harness.quality import gsm8k
from harness.quality.grade import GRADER, GRADER_VERSION
from harness.report.build import build_report, check_report, write_report
from harness.report.collect import load_campaign_data
from harness.report.quality import cell_quality, grade_folder
from tests.helpers.folders import manifest, outcome

IDS = [gsm8k.question_id(i) for i in range(4)]  # golds 18, 3, 70000, 540
BASE = ["Janet makes 9 * 2 = 18.\n#### 18", "It takes 2 + 1 = 3 bolts", "I do not know.", "#### 540"]
CELL = ["She makes 18 dollars a day.", "#### 4\nso 3 bolts", "He made 70,000 dollars", "The answer: 540 meters"]


def _run(folder: Path, run_id: str, replies: list[str]) -> dict[str, str]:
    d = run_dir(folder, run_id)
    d.mkdir(parents=True)
    with MetricsWriter(d / "metrics.csv", {"engine": "bmoe"}) as w:
        for turn in range(len(replies)):
            for step in (1, 2):
                w.row(TokenRow(step=step, steps=2, wall_ms=10.0 + turn, turn=turn, token_id=5))
            w.summary(Summary(n_decode=2, decode_s=0.02))
    rw = RepliesWriter(d / REPLIES_FILE)
    for turn, (qid, text) in enumerate(zip(IDS, replies, strict=True)):
        rw.reply(Reply(turn=turn, id=qid, prompt=f"Q: {gsm8k.by_id(qid).question}", reply=text, n_prompt=30,
                       n_tokens=2, stop="eog", prefill_ms=5.0, decode_ms=20.0, time_ms=26.0))
    rw.close()
    (d / "outcome.json").write_text("{}\n")
    return hash_files(d)


def _folder(tmp_path: Path, grader_version: int = GRADER_VERSION, second_round: list[str] | None = None) -> Path:
    """Two cells with the BASE and CELL replies; `second_round`: a second run of the base with these."""
    folder = tmp_path / "2026-12-01-q"
    (folder / "runs").mkdir(parents=True)
    q = QualityRecord(suite="gsm8k", ids=IDS, template="Q: {question}", dataset_sha256=gsm8k.dataset_sha256(),
                      prompts_sha256="0" * 64, grader=GRADER, grader_version=grader_version)
    runs = []
    plan_runs = [("r01-c00", 0, 0, BASE), ("r01-c01", 0, 1, CELL)]
    if second_round is not None:
        plan_runs.append(("r02-c00", 1, 0, second_round))
    for pos, (rid, rnd, cell, replies) in enumerate(plan_runs):
        h = _run(folder, rid, replies)
        slot = RunRecord(run_id=rid, round=rnd, cell=cell, position=pos)
        runs.append(slot.finish(outcome(), h))
    m = manifest("q", status="complete", runs=runs, cells=[("base", {}), ("k6", {"--n-expert-used": 6})],
                 quality=q, repeats=1 if second_round is None else 2, warmup_tokens=0)
    save_manifest(folder, m)
    return folder


def test_grades_and_exact_statistics_of_fixture_replies(tmp_path):
    data = load_campaign_data(_folder(tmp_path))
    g = grade_folder(data)
    assert g is not None and (g.grader, g.grader_version) == (GRADER, GRADER_VERSION)
    base, cell = cell_quality(data, g)
    assert [x.correct for x in base.grades] == [True, True, False, True]
    assert [x.correct for x in cell.grades] == [True, False, True, True]
    assert [x.how for x in cell.grades] == ["last number", "####", "last number", "last number"]
    assert [x.extracted for x in cell.grades] == ["18", "4", "70000", "540"]
    assert (base.acc.correct, base.acc.n) == (3, 4) and base.acc.low == pytest.approx(0.19412, abs=1e-5)
    m = cell.vs_base
    assert (m.only_base, m.only_cell, m.p) == (1, 1, 1.0)


def test_findings_list_every_differing_question_with_both_replies(tmp_path):
    rep = build_report(_folder(tmp_path), with_plots=False)
    f = rep.texts["findings.md"]
    q = f.split("## Quality (GSM8K)", 1)[1].split("## I/O roofline", 1)[0]
    assert "| base | 3/4 | 75.0% [19.4%, 99.4%] | (base) |" in q
    assert "| k6 | 3/4 | 75.0% [19.4%, 99.4%] | 1 | 1 | 1 |" in q
    diffs = q.split("### Questions whose grade differs between cells", 1)[1]
    assert "`gsm8k-test-0001` (gold 3)" in diffs and "`gsm8k-test-0002` (gold 70000)" in diffs
    assert "gsm8k-test-0000" not in diffs and "gsm8k-test-0003" not in diffs
    for text in (BASE[1], CELL[1], BASE[2], CELL[2]):
        assert text in diffs
    assert "at least 6 questions change grade" in q
    assert "synthetic" not in q  # a model given by path: no synthetic-model caveat
    assert json.loads(rep.texts[GRADES_FILE])["format"] == "bmoe-grades"


def test_grade_command_and_report_check_cover_the_grades(tmp_path, capsys):
    folder = _folder(tmp_path)
    assert main(["grade", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "base: 3/4 = 75.0% [19.4, 99.4] (base)" in out and "k6: 3/4" in out and "p=1" in out
    g = read_grades(folder / GRADES_FILE)
    assert [r.run_id for r in g.runs] == ["r01-c00", "r01-c01"]
    write_report(folder)
    assert check_report(folder) == []
    # a hand-edited grade is caught
    text = (folder / GRADES_FILE).read_text()
    (folder / GRADES_FILE).write_text(text.replace('"correct": false', '"correct": true', 1))
    assert check_report(folder) == [GRADES_FILE]
    assert main(["report", str(folder), "--check"]) == 2
    assert "grades.json differ from what the raw data gives" in capsys.readouterr().err
    write_report(folder)
    # a changed reply is caught as a raw-file change (its sha256 is in the manifest), and regrades differently
    p = run_dir(folder, "r01-c00") / REPLIES_FILE
    p.write_text(p.read_text().replace("I do not know.", "#### 70000"))
    bad = check_report(folder)
    assert "runs/r01-c00/replies.jsonl" in bad and GRADES_FILE in bad


def test_a_folder_graded_under_another_rule_is_refused(tmp_path):
    data = load_campaign_data(_folder(tmp_path, grader_version=GRADER_VERSION + 1))
    with pytest.raises(UserError, match=f"v{GRADER_VERSION + 1}, this bmoe-bench grades with {GRADER} "
                                        f"v{GRADER_VERSION}"):
        grade_folder(data)


def test_a_plain_campaign_has_nothing_to_grade(tmp_path, capsys):
    folder = _folder(tmp_path)
    m = json.loads((folder / "manifest.json").read_text())
    del m["campaign"]["quality"]
    (folder / "manifest.json").write_text(json.dumps(m))
    assert main(["grade", str(folder)]) == 2
    assert "no quality block" in capsys.readouterr().err
    assert GRADES_FILE not in build_report(folder, with_plots=False).texts


@pytest.mark.parametrize("again, note", [(BASE, False), (CELL, True)])
def test_a_repeat_with_other_replies_is_named_and_the_first_round_is_used(tmp_path, again, note):
    folder = _folder(tmp_path, second_round=again)
    data = load_campaign_data(folder)
    base = cell_quality(data, grade_folder(data))[0]
    assert base.run_id == "r01-c00" and base.acc.correct == 3
    assert base.repeats_agree is (not note)
    f = build_report(folder, with_plots=False).texts["findings.md"]
    assert ("Repeats of base gave different replies" in f) is note
