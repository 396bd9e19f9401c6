"""Rows a reader can tell apart: in reports/README.md every row names each flag that varies in its table and
differs from the table's common base, and no two rows of one table (or of one findings.md table) carry the
same label; the engines axis refuses a bmoe cell with --prefetch 2 against a C++ cell without it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.errors import UserError
from harness.report.build import build_report
from harness.report.collect import load_campaign_data
from harness.report.overview import Row, build_overview, differing
from harness.report.peers import engine_problems

REPO = Path(__file__).resolve().parents[2]
COMMITTED = sorted(p.parent for p in (REPO / "bench-data").glob("*/manifest.json")
                   if (p.parent / "findings.md").is_file())


def tables(text: str) -> list[list[list[str]]]:
    """Every markdown table: its rows (header first) as lists of cells."""
    out: list[list[list[str]]] = []
    cur = None
    for ln in text.splitlines():
        if ln.startswith("|---"):
            continue
        if ln.startswith("|"):
            if cur is None:
                cur = []
                out.append(cur)
            cur.append([c.strip() for c in ln.strip().strip("|").split("|")])
        else:
            cur = None
    return out


def test_no_two_rows_of_a_reports_table_read_the_same():
    text = build_overview(REPO / "bench-data", REPO / "reports")
    tabs = tables(text)
    assert tabs
    for t in tabs:
        head, rows = t[0], t[1:]
        ident = [head.index(c) for c in ("Setup", "Active experts", "Cache", "Lanes", "Folder")]
        labels = [tuple(r[i] for i in ident) for r in rows]
        dup = {x for x in labels if labels.count(x) > 1}
        assert not dup, f"rows of one table read the same: {sorted(dup)[:2]}"


def test_the_overlap_rows_name_what_they_vary():
    text = build_overview(REPO / "bench-data", REPO / "reports")
    rows = [r for t in tables(text) for r in t[1:] if "2026-12-01-overlap-30b]" in r[-1]]
    setups = [r[0] for r in rows]
    assert any(s.endswith("`--prefetch 2`") for s in setups)
    assert any(s.endswith("`--prefetch 1`, `--predict-prefetch`") for s in setups)
    assert any(s.endswith("`--route-ahead 2`") for s in setups)
    assert len(set(setups)) == len(setups) == 7


def _row(**flags: str) -> Row:
    return Row(setup="streamed", active="8", cache="2000 MiB", lanes="4", tok_s="1", flash="1", hit="1",
               folder="f", flags=flags)


def test_differing_names_only_what_varies_against_the_common_base():
    rows = [_row(threads="1", prefetch="0", predict_prefetch="False"),
            _row(threads="1", prefetch="2", predict_prefetch="False"),
            _row(threads="2", prefetch="0", predict_prefetch="True"),
            _row(threads="1", prefetch="0", predict_prefetch="False", ngram_size="3")]  # absent elsewhere: default
    assert differing(rows) == [[], ["--prefetch 2"], ["-t 2", "--predict-prefetch"], []]
    assert differing([_row(evict_thread="True"), _row(evict_thread="False")]) == [[], ["--no-evict-thread"]]


@pytest.mark.parametrize("folder", COMMITTED, ids=lambda p: p.name)
def test_no_two_rows_of_a_findings_table_read_the_same(folder):
    for t in tables(build_report(folder, with_plots=False).texts["findings.md"]):
        # a table across devices names each row by its setting and its device (two label columns)
        labels = [(r[0], r[1]) if t[0][1] == "device" else r[0] for r in t[1:]]
        assert len(set(labels)) == len(labels), f"{folder.name}: table {t[0][:3]}: {labels}"


def test_a_bmoe_cell_with_prefetch_is_refused_against_a_cxx_cell_without(tmp_path):
    src = REPO / "bench-data" / "2026-12-01-peer-cxx"
    folder = tmp_path / src.name
    shutil.copytree(src, folder)
    assert engine_problems(load_campaign_data(folder)) == []
    csv = folder / "runs" / "r01-c02" / "metrics.csv"  # bmoe --cache-mb=160, its first run
    text = csv.read_text()
    assert "# cfg.prefetch=" not in text  # the build of that run had no --prefetch yet: 0
    csv.write_text(text.replace("# cfg.io_threads=4\n", "# cfg.io_threads=4\n# cfg.prefetch=2\n", 1))
    assert engine_problems(load_campaign_data(folder)) == [
        "cells 'bmoe --cache-mb=160' and 'cxx --cache-mb=160' differ in more than the engine (from their CSV "
        "preambles): prefetch 2 vs 0"]
    with pytest.raises(UserError, match="refusing to compare engines"):
        build_report(folder, with_plots=False)
