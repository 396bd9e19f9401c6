"""Raw files and manifests validated when read: a truncated or corrupted metrics.csv marks its run invalid,
with the reason in findings.md, never a quietly different figure; a malformed manifest is one line from
`report` and from `run`, and `run` never abandons an unfinished folder for a new one."""

from __future__ import annotations

import json

import pytest

from harness.formats.results_csv import read_results
from tests.helpers.faults import cli, error_line, folders
from tests.helpers.runner import campaign

# ---- 3. raw files and manifests validated when read --------------------------------------------------------------

def _cut_half(t: str) -> str:
    return t[: len(t) // 2]


def _drop_rows(t: str) -> str:
    lines = t.splitlines(keepends=True)
    body = [i for i, x in enumerate(lines) if not x.startswith("#")]
    return "".join(lines[: body[-2]] + [x for x in lines[body[-1] + 1:]])


CSV_FAULTS = {
    "truncated-mid-row": _cut_half,
    "rows-missing": _drop_rows,
    "no-summary": lambda t: "".join(x for x in t.splitlines(keepends=True) if not x.startswith("# summary")),
    "wall-corrupted": lambda t: _corrupt_wall(t),
    "column-renamed": lambda t: t.replace(",wall_ms,", ",wall,", 1),
}


def _corrupt_wall(t: str) -> str:
    lines = t.splitlines(keepends=True)
    i = [j for j, x in enumerate(lines) if x[:1].isdigit()][2]
    f = lines[i].split(",")
    f[2] = "garbage"
    lines[i] = ",".join(f)
    return "".join(lines)


@pytest.mark.parametrize("fault", list(CSV_FAULTS))
def test_a_broken_metrics_csv_marks_its_run_invalid(copy, fault):
    csv = copy / "runs" / "r01-c00" / "metrics.csv"
    csv.write_text(CSV_FAULTS[fault](csv.read_text()))
    r = cli("report", copy)
    assert r.returncode == 0, r.stderr
    md = (copy / "findings.md").read_text()
    warn = [x for x in md.splitlines() if x.startswith("- invalid:")]
    assert len(warn) == 1 and "r01-c00: runs/r01-c00/metrics.csv: " in warn[0] and str(copy) not in warn[0], md
    base = read_results(copy / "results.csv")[1][0]
    assert base["runs_ok"] == "1" and base["runs_failed"] == "1"
    r = cli("report", copy, "--check")
    assert r.returncode == 2 and "runs/r01-c00/metrics.csv" in error_line(r.stderr)


MANIFEST_FAULTS = {
    "cut-json": lambda t: t[: len(t) // 2],
    "no-runs": lambda t: json.dumps({k: v for k, v in json.loads(t).items() if k != "runs"}),
    "runs-wrong-type": lambda t: json.dumps({**json.loads(t), "runs": "all of them"}),
    "status-wrong-type": lambda t: json.dumps({**json.loads(t), "status": 3}),
}


@pytest.mark.parametrize("fault", list(MANIFEST_FAULTS))
def test_a_malformed_manifest_is_one_line_from_report(copy, fault):
    p = copy / "manifest.json"
    p.write_text(MANIFEST_FAULTS[fault](p.read_text()))
    for extra in ((), ("--check",)):
        r = cli("report", copy, *extra)
        assert r.returncode == 2
        assert str(p) in error_line(r.stderr)


def test_run_never_abandons_an_unfinished_folder_with_a_cut_manifest(tmp_path):
    p = campaign(tmp_path, repeats=2)
    out = tmp_path / "bd"
    r = cli("run", p, "--out", out, "--set", "tokens=6")
    (folder,) = folders(out)
    m = folder / "manifest.json"
    obj = json.loads(m.read_text())
    obj["status"] = "interrupted"
    m.write_text(json.dumps(obj)[:3000])
    r = cli("run", p, "--out", out, "--set", "tokens=6")
    assert r.returncode == 2
    line = error_line(r.stderr)
    assert str(m) in line and "not valid JSON" in line and "--fresh" in line, line
    assert folders(out) == [folder]  # no -2 folder, no runs redone
