"""Intervals in findings.md and results.csv from hand-made campaign folders with known answers: a ratio
paired over rounds cancels what a round shares and the findings say by how much; a round a cell lacks
is left out of its pairs; with fewer than two rounds in common the ratio is unpaired and says so; a
single run has no interval between runs."""

from __future__ import annotations

import pytest

from harness import stats
from harness.formats.results_csv import read_results
from harness.report.build import build_report, write_report
from harness.report.collect import load_campaign_data
from harness.report.results import compute_results
from tests.helpers.folders import TWO, csv_text, make_folder

SPEED = [1.0, 1.6, 0.7, 1.3]  # the machine, round by round (shared by both cells of a round)


def drifting_folder(tmp_path, *, fail: tuple[int, int] | None = None):
    """The base at 10 tok/s, --fast=on at exactly 2x it in every round, the machine's speed varying by round."""
    runs = []
    for rnd, s in enumerate(SPEED):
        for cell in (0, 1) if rnd % 2 == 0 else (1, 0):
            ms = 100.0 / s / (2 if cell else 1)
            runs.append((cell, rnd, None if fail == (cell, rnd) else csv_text([999] + [ms * f for f in (0.9, 1.1, 1)])))
    return make_folder(tmp_path, TWO, runs, repeats=len(SPEED))


def test_pairing_cancels_what_a_round_shares_and_the_findings_say_how_much(tmp_path):
    folder = drifting_folder(tmp_path)
    res = compute_results(load_campaign_data(folder))
    fast = res.cells[1]
    assert fast.ratio.method == stats.T_PAIRED and fast.ratio.n == 4
    assert (fast.ratio.point, fast.ratio.low, fast.ratio.high) == pytest.approx((2.0, 2.0, 2.0))
    un = fast.ratio.unpaired
    assert un.point == pytest.approx(2.0) and un.low < 1.6 and un.high > 2.5  # the rounds' spread, not cancelled
    assert fast.tok_s.method == stats.T_RUNS and fast.tok_s.low < 15 < 30 < fast.tok_s.high
    write_report(folder)
    md = (folder / "findings.md").read_text()
    assert "### Pairing over rounds" in md
    assert "| --fast=on | 4 | 2.00x [2.00, 2.00] | 2.00x [" in md and "| 0% |" in md
    assert "x base: ratio of mean tok/s, paired over rounds" in md and "t interval over runs on the log scale" in md
    version, rows = read_results(folder / "results.csv")
    assert version == 2
    assert [r["ci_method"] for r in rows] == ["t over runs", "t over runs"]
    assert [r["ratio_method"] for r in rows] == ["", "paired t over rounds"]
    assert rows[1]["ratio_lo"] == rows[1]["ratio_hi"] == "2"


def test_a_round_one_cell_lacks_is_left_out_of_the_pairs(tmp_path):
    res = compute_results(load_campaign_data(drifting_folder(tmp_path, fail=(0, 2))))
    r = res.cells[1].ratio
    assert r.method == stats.T_PAIRED and r.n == 3
    assert (r.point, r.low, r.high) == pytest.approx((2.0, 2.0, 2.0))


def test_fewer_than_two_common_rounds_is_unpaired_and_said_so(tmp_path):
    runs = [(0, 0, csv_text([999, 100, 110, 90])), (1, 0, None), (1, 1, csv_text([999, 50, 55, 45])),
            (0, 1, None), (0, 2, csv_text([999, 120, 100, 95])), (1, 2, csv_text([999, 52, 50, 48]))]
    # base ran rounds 0 and 2, the other cell rounds 1 and 2: one round in common
    folder = make_folder(tmp_path, TWO, runs, repeats=3)
    res = compute_results(load_campaign_data(folder))
    r = res.cells[1].ratio
    assert r.method == stats.T_UNPAIRED and r.unpaired is None and r.low < r.point < r.high
    md = build_report(folder, with_plots=False).texts["findings.md"]
    assert "unpaired (Welch t on the log scale over each cell's own runs): fewer than two rounds" in md
    assert "### Pairing over rounds" not in md


def test_a_single_run_has_no_interval_between_runs(tmp_path):
    runs = [(0, 0, csv_text([999, 100, 110, 90, 100])), (1, 0, csv_text([999, 50, 55, 45, 50]))]
    folder = make_folder(tmp_path, TWO, runs, repeats=1)
    texts = build_report(folder, with_plots=False).texts
    md = texts["findings.md"]
    assert "| --fast=on | 1/1 | 20.00 (one run: spread between runs unknown; within it " in md
    assert "2.00x (one run: spread between runs unknown; within it " in md
    assert "no difference involving them is established" in md
    (folder / "results.csv").write_text(texts["results.csv"])
    _, rows = read_results(folder / "results.csv")
    assert rows[1]["ci_method"] == rows[1]["ratio_method"] == "one run: spread between runs unknown"
    assert rows[1]["tok_s"] == "20" and rows[1]["tok_s_lo"] == rows[1]["tok_s_hi"] == rows[1]["ratio_lo"] == ""
