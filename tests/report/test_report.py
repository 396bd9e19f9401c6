"""Reports from raw files: both engines' CSVs, numbers with known answers, determinism, --check, and the
author's section surviving regeneration."""

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness import stats
from harness.errors import UserError
from harness.formats.manifest import VERSION, RunRecord, load_manifest, save_manifest
from harness.formats.metrics_csv import parse_metrics, read_metrics
from harness.report.build import build_report, check_report, write_report
from harness.report.collect import load_campaign_data
from harness.report.findings import AUTHOR_BEGIN, AUTHOR_END
from harness.report.results import compute_results
from tests.helpers.folders import COLS, TWO, csv_text, make_folder

SHARED = Path(__file__).resolve().parents[2] / "data" / "route-traces"


# ---- CSV reader ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,tokens,tok_s,hit", [("qwen", 128, 5.657, 74.88), ("gptoss", 64, 0.503, 32.41)])
def test_reads_the_cpp_engines_csv_and_agrees_with_its_own_summary(name, tokens, tok_s, hit):
    m = read_metrics(SHARED / f"{name}.metrics")
    assert m.format is None and m.meta == {}  # no preamble in the C++ files
    assert len(m.rows) == tokens and "rss_mib" not in m.rows.columns
    assert m.summaries[0]["tok/s"] == f"{tok_s}"
    # our tok/s definition (tokens / summed wall time) reproduces the engine's own summary
    assert round(stats.tok_s(m.wall_ms()), 3) == tok_s
    assert m.col("cache_hit_pct")[-1] == hit
    assert m.col("rss_mib") is None


def test_reads_a_bmoe_v2_preamble_and_unmeasured_values():
    text = ("# bmoe_metrics v2\n# engine_version=0.1.0\n# cfg.cache_mb=64\n# cfg.prompt=a=b\n"
            f"{COLS},rss_mib\n1,2,100.0,-1,90.0,0,-1,-1,-1,3,50.0,512.5\n2,2,50.0,-1,45.0,0,-1,-1,-1,0,40.0,513\n"
            "# summary decode_tok_s=13.3 n_decode=2\n")
    m = parse_metrics(text)
    assert m.format == "bmoe_metrics v2"
    assert m.meta == {"engine_version": "0.1.0", "cfg.cache_mb": "64", "cfg.prompt": "a=b"}
    assert m.summaries == [{"decode_tok_s": "13.3", "n_decode": "2"}]
    assert np.isnan(m.col("io_ms")).all() and np.isnan(m.col("cache_hit_pct")).all()
    assert list(m.col("majflt")) == [3.0, 0.0] and list(m.col("rss_mib")) == [512.5, 513.0]


def test_reader_errors_are_one_line():
    with pytest.raises(UserError, match="no wall_ms column"):
        parse_metrics("step,foo\n1,2\n", "x.csv")
    with pytest.raises(UserError, match="no header or rows"):
        parse_metrics("# bmoe_metrics v2\n", "x.csv")
    with pytest.raises(UserError, match="newer than this bmoe-bench reads"):
        parse_metrics("# bmoe_metrics v3\nstep,wall_ms\n1,2\n", "x.csv")


def test_the_streamed_read_sees_what_the_whole_text_gives(tmp_path):
    """read_metrics streams the file into pandas (comments taken on the way): the same table, preamble, summaries
    and cut-row verdict as parsing the whole text, for committed files of both engines and for a cut last row,
    a comment between rows and blank lines."""
    repo = Path(__file__).resolve().parents[2]
    files = [SHARED / "qwen.metrics", *sorted(repo.glob("bench-data/2026-11-30-demo/runs/*/metrics.csv"))[:2]]
    text = ("# bmoe_metrics v2\n# engine=bmoe\n" f"{COLS}\n1,2,100.0,-1,90.0,0,-1,-1,-1,3,50.0\n\n"
            "# summary decode_tok_s=1 n_decode=1\n2,2,50.0,-1,45.0,0,-1,-1,-1,0,40.0\n3,2,50.0,-1")
    (tmp_path / "cut.csv").write_text(text)
    for f in [*files, tmp_path / "cut.csv"]:
        a, b = read_metrics(f), parse_metrics(f.read_text(), str(f))
        assert a.rows.equals(b.rows) and (a.format, a.meta, a.summaries) == (b.format, b.meta, b.summaries), f
        assert a.cut_last_row == b.cut_last_row == (f.name == "cut.csv"), f
    assert len(read_metrics(tmp_path / "cut.csv").summaries) == 1


# ---- a campaign folder written by hand, with known answers -------------------------------------------------

def two_cell_folder(tmp_path, **kw):
    runs = [(0, 0, csv_text([999, 100, 100, 100, 100], preamble={"cfg.fast": "False", "engine_version": "9"})),
            (1, 0, csv_text([999, 50, 50, 50, 50], preamble={"cfg.fast": "True", "engine_version": "9"},
                            read_mib=5.0)),
            (1, 1, csv_text([999, 50, 50, 50, 50], preamble={"cfg.fast": "True", "engine_version": "9"},
                            read_mib=5.0)),
            (0, 1, csv_text([999, 100, 100, 100, 100], preamble={"cfg.fast": "False", "engine_version": "9"}))]
    return make_folder(tmp_path, TWO, runs, **kw)


def test_known_answers_flow_into_the_findings(tmp_path):
    folder = two_cell_folder(tmp_path, bandwidth={"mib_s": 200.0, "method": "test"})
    res = compute_results(load_campaign_data(folder))
    base, fast = res.cells
    # warm-up token (999 ms) trimmed: 4 tokens of 100 ms = 10 tok/s; 50 ms = 20 tok/s; identical runs
    assert (base.tok_s.point, base.tok_s.low, base.tok_s.high) == pytest.approx((10, 10, 10))
    assert (fast.ratio.point, fast.ratio.low, fast.ratio.high) == pytest.approx((2, 2, 2))
    assert fast.io_s == pytest.approx(0.015) and fast.mgmt_s == pytest.approx(0.005)
    assert fast.compute_s == pytest.approx(0.03) and fast.mib_per_tok == pytest.approx(5.0)
    assert res.varying_keys == ["cfg.fast"] and res.fixed_config == {"engine_version": "9"}
    md = build_report(folder, with_plots=False).texts["findings.md"]
    verdict = md.split("## Verdict\n\n", 1)[1].split("\n\n", 1)[0]
    assert verdict.startswith("**--fast=on** is fastest: 20.00 [20.00, 20.00] tok/s (95% CI).")
    assert "2.00x [2.00, 2.00]" in verdict
    assert md.index("## Verdict") < md.index("## Setup") < md.index("## Results") < md.index("## Run order") \
        < md.index("## I/O roofline") < md.index("## What this does not show") < md.index("## Reproduce")
    # the table column comes from the CSV preambles, the label from the manifest
    assert "| cell | cfg.fast | runs |" in md and "| --fast=on | True | 2/2 | 20.00 [20.00, 20.00] |" in md
    # roofline: 200 MiB/s / 5 MiB per token = 40 tok/s; 20 achieved = 50%; combined: 1 / max(5/200, 0.03 s
    # compute) = 33.33 tok/s, 60% of it
    assert "| --fast=on | 5.0 | 40.00 | 0.030 | 33.33 | 20.00 | 50% | 60% |" in md
    assert "bmoe-bench run campaigns/t.yaml" in md
    assert "few-runs: base: only 2 successful runs" in md


def test_overlapping_intervals_say_no_difference(tmp_path):
    rng = np.random.default_rng(0)
    runs = []
    for rnd in range(4):
        for cell in (0, 1):
            runs.append((cell, rnd, csv_text(list(100 + rng.normal(0, 8, 6)))))
    folder = make_folder(tmp_path, TWO, runs, repeats=4)
    md = build_report(folder, with_plots=False).texts["findings.md"]
    assert "**No difference detectable** between" in md


def test_failed_and_single_runs(tmp_path):
    runs = [(0, 0, csv_text([100, 100, 110, 90, 100])), (1, 0, None)]
    folder = make_folder(tmp_path, TWO, runs, repeats=1)
    res = compute_results(load_campaign_data(folder))
    assert res.cells[0].tok_s.basis == "tokens" and res.cells[1].tok_s is None
    md = build_report(folder, with_plots=False).texts["findings.md"]
    assert "**base** is fastest: 10.00 (one run: spread between runs unknown; within it " in md
    assert "one run: the spread between runs is unknown, so no interval" in md  # the methods note
    assert "failed: engine exited 3: boom" in md
    assert "--fast=on: no successful run" in md


def test_report_is_deterministic_and_check_detects_drift(tmp_path):
    folder = two_cell_folder(tmp_path)
    a = build_report(folder)
    b = build_report(folder)
    assert a.texts == b.texts and a.plots == b.plots
    assert all(png.startswith(b"\x89PNG") for png in a.plots.values())
    assert check_report(folder) == ["findings.md", "results.csv", "plots/tok_s.png", "plots/split.png",
                                    "plots/tokens.png"]  # nothing written yet
    write_report(folder)
    assert sorted(p.name for p in (folder / "plots").iterdir()) == ["split.png", "tok_s.png", "tokens.png"]
    assert check_report(folder) == []
    csv = folder / "runs" / "r01-c01" / "metrics.csv"
    csv.write_text(csv.read_text().replace(",50,", ",40,"))  # the raw data changes
    assert check_report(folder) == ["runs/r01-c01/metrics.csv", "findings.md", "results.csv"]


def test_author_section_survives_regeneration(tmp_path):
    folder = two_cell_folder(tmp_path)
    write_report(folder)
    f = folder / "findings.md"
    notes = "We think the fast path wins because of X.\n\nSecond paragraph."
    text = f.read_text()
    before, rest = text.split(AUTHOR_BEGIN)
    f.write_text(before + AUTHOR_BEGIN + "\n" + notes + "\n" + AUTHOR_END + rest.split(AUTHOR_END)[1])
    assert check_report(folder) == []  # the author's prose is not a difference
    write_report(folder)
    assert notes in f.read_text()


def test_cli_report_check_exit_codes(tmp_path):
    folder = two_cell_folder(tmp_path)
    cmd = [sys.executable, "-m", "harness.bench_cli", "report"]
    r = subprocess.run([*cmd, str(folder), "--check"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "findings.md, results.csv, plots/tok_s.png, plots/split.png, plots/tokens.png differ from what the raw " \
           "data gives, or are missing or cut short" in r.stderr
    write_report(folder)
    r = subprocess.run([*cmd, str(folder), "--check"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    with pytest.raises(UserError, match="no such campaign folder"):
        load_campaign_data(tmp_path / "nope")


def test_refuses_a_newer_manifest(tmp_path):
    folder = two_cell_folder(tmp_path)
    p = folder / "manifest.json"
    p.write_text(p.read_text().replace(f'"version": {VERSION},', '"version": 99,', 1))
    with pytest.raises(UserError, match="version 99 is newer than this bmoe-bench understands"):
        load_campaign_data(folder)


def test_a_campaign_where_every_run_failed_still_reports(tmp_path):
    folder = make_folder(tmp_path, TWO, [(0, 0, None), (1, 0, None)], repeats=1)
    rep = build_report(folder)
    assert "**No result**: no run finished successfully" in rep.texts["findings.md"]
    assert rep.texts["findings.md"].count("engine exited 3: boom") >= 2


def test_an_incomplete_campaign_says_so(tmp_path):
    folder = two_cell_folder(tmp_path)
    m = load_manifest(folder)
    m.runs[3] = RunRecord(**m.runs[3].slot(), status="pending")
    save_manifest(folder, m)
    md = build_report(folder, with_plots=False).texts["findings.md"]
    assert "**Incomplete campaign**: 1 of 4 runs have not run yet" in md


def test_entry_temperature_rise_is_reported_as_throttling(tmp_path):
    runs = [(c, r, csv_text([100] * 5)) for r in range(2) for c in (0, 1)]
    folder = make_folder(tmp_path, TWO, runs, temps=[40.0, 44.0, 47.0, 52.5])
    md = build_report(folder, with_plots=False).texts["findings.md"]
    assert "throttling: Throttling: the CPU entered runs up to 12.5 C hotter than the first run" in md
    assert "| 4 | r02-c01 | --fast=on | 2 |" in md and "| 52.5 |" in md


def test_findings_name_no_path_of_their_folder_so_a_renamed_copy_passes_the_check(tmp_path, monkeypatch):
    folder = two_cell_folder(tmp_path)
    monkeypatch.chdir(folder)
    write_report(Path("."))  # `report .` inside the folder writes what `report <path>` writes
    md = (folder / "findings.md").read_text()
    assert "bmoe-bench report DIR    # DIR: this folder\n" in md
    assert folder.name not in md and str(tmp_path) not in md
    monkeypatch.chdir(tmp_path)
    copy = tmp_path / "elsewhere" / "renamed"
    shutil.copytree(folder, copy)
    assert check_report(copy) == []


def _with_prefetch(text: str, spec: int, wasted: int) -> str:
    """csv_text's file with the prefetch columns: `spec` speculative bytes per token, `wasted` of them evicted."""
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            out.append(line)
        elif line.startswith("step,"):
            out.append(line + ",prefetch_bytes,prefetch_used_bytes,prefetch_wasted_bytes")
        else:
            out.append(line + f",{spec},{spec - wasted},{wasted}")
    return "\n".join(out) + "\n"


def test_prefetch_columns_appear_only_where_a_cell_read_ahead(tmp_path):
    pre = {"engine_version": "9"}
    plain = csv_text([999, 100, 100, 100, 100], preamble={**pre, "cfg.fast": "False"})
    ahead = _with_prefetch(csv_text([999, 50, 50, 50, 50], preamble={**pre, "cfg.fast": "True"}), 2**20, 2**18)
    folder = make_folder(tmp_path, TWO, [(0, 0, plain), (1, 0, ahead), (1, 1, ahead), (0, 1, plain)])
    res = compute_results(load_campaign_data(folder))
    assert res.cells[1].prefetch_mib_per_tok == pytest.approx(1.0)
    assert res.cells[1].prefetch_wasted_pct == pytest.approx(25.0)
    out = build_report(folder, with_plots=False).texts
    assert "| prefetch MiB/tok | prefetch wasted % |" in out["findings.md"]
    assert "| 1.0 | 25.0 |" in out["findings.md"] and "prefetch_wasted_pct" in out["results.csv"].splitlines()[1]
    # a folder with no read-ahead keeps its columns
    other = two_cell_folder(tmp_path / "o")
    out = build_report(other, with_plots=False).texts
    assert "prefetch" not in out["findings.md"] and "prefetch" not in out["results.csv"]
