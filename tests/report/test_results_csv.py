"""results.csv (`bmoe-results v2`, harness/formats/results_csv.py): written and read back, a v1 file (no
version line) still read, a newer or foreign file refused in one line."""

from __future__ import annotations

import pytest

from harness.errors import UserError
from harness.formats.results_csv import COLUMNS, VERSION, read_results, results_text


def _row(cell: str, **kw) -> dict:
    return {"cell": cell, "cfg.x": "1", **dict.fromkeys(COLUMNS), **kw}


def test_round_trip_with_the_version_line(tmp_path):
    rows = [_row("base", runs_ok=3, tok_s=10.0, tok_s_lo=9.123456789, ci_method="t over runs", ratio=1.0),
            _row("a,b", runs_ok=3, tok_s=20.0, ci_method="one run: spread between runs unknown", ratio=2.0,
                 ratio_lo=1.5, ratio_method="paired t over rounds")]
    p = tmp_path / "results.csv"
    text = results_text(rows)
    assert text.splitlines()[0] == f"# bmoe-results v{VERSION}" and VERSION == 2
    p.write_text(text)
    version, back = read_results(p)
    assert version == 2 and [r["cell"] for r in back] == ["base", "a,b"]
    assert back[0]["tok_s_lo"] == "9.12346" and back[0]["ratio_lo"] == "" and back[1]["ratio_lo"] == "1.5"
    assert back[1]["ratio_method"] == "paired t over rounds" and back[0]["runs_ok"] == "3"
    assert {"ci_method", "ratio_method"} <= set(COLUMNS) and back[0]["cfg.x"] == "1"
    with pytest.raises(ValueError, match="not the declared ones"):  # a column nobody declared
        results_text([{**rows[0], "surprise": 1}])


def test_a_v1_file_is_read_and_newer_or_foreign_ones_are_refused(tmp_path):
    p = tmp_path / "results.csv"
    p.write_text("cell,tok_s,tok_s_lo,tok_s_hi,ci_basis\nbase,10,9,11,runs\n")
    assert read_results(p) == (1, [{"cell": "base", "tok_s": "10", "tok_s_lo": "9", "tok_s_hi": "11",
                                    "ci_basis": "runs"}])
    p.write_text("# bmoe-results v3\ncell\nbase\n")
    with pytest.raises(UserError, match="bmoe-results v3 is newer than this bmoe-bench reads"):
        read_results(p)
    p.write_text("# bmoe_metrics v2\nstep,wall_ms\n")
    with pytest.raises(UserError, match="not a bmoe-results file"):
        read_results(p)
