"""The README's "What has been measured" table, checked against the folders each row cites.

Per row: every path in the data column exists (a folder, a brace list of folders, or a file such as
reports/roofline.md); every figure with an interval in the answer column, `15.48x [14.92, 16.07]`, is in one of
those folders: a row of its results.csv whose value, low and high (any `X`, `X_lo`, `X_hi` columns) round to the
README's three figures, or the same three figures printed in one of its .md files (findings.md, recall.md) or in a
cited .md file; every bare ratio (`16.79x`) is a results.csv ratio or an `Nx` figure of those .md files at its
precision; and every `--n-expert-used N` a cited folder's cells run (manifest.json) is named in the row as
`--n-expert-used N`. A figure that is in none of its folders fails: fix the README from the folder, not the test.

Also: every committed results.csv reads with the two one-liners the README shows (pandas, the csv module) to the
rows harness.formats.results_csv reads."""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.formats.results_csv import read_results

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")
NUM = r"[-+]?\d+(?:\.\d+)?"
INTERVAL = re.compile(rf"({NUM})(?:x|%)?\s*\[({NUM}), ({NUM})\]")
BARE_RATIO = re.compile(rf"(?<![\d.\-/])({NUM})x(?!\s*\[)(?! past)")  # not a range's end, not "5x past its cap"
MD_RATIO = re.compile(rf"({NUM})x")
K = re.compile(r"--n-expert-used (\d+)")


@dataclass(frozen=True)
class Row:
    question: str
    answer: str
    data: str

    @property
    def name(self) -> str:
        return self.question[:60]


def table_rows() -> list[Row]:
    section = README.split("## What has been measured", 1)[1]
    lines = section.split("\n\n", 2)[1].splitlines()
    assert lines[0].startswith("| question | answer") and lines[1] == "|---|---|---|"
    out = []
    for ln in lines[2:]:
        cols = [c.strip() for c in ln.strip().strip("|").split(" | ")]
        assert len(cols) == 3, f"a row of the table is not question | answer | data: {ln[:80]}"
        out.append(Row(*cols))
    return out


ROWS = table_rows()


def cited(row: Row) -> list[Path]:
    """Every path the data column names in backticks (`a/{b,c}/` expanded); each must exist."""
    out = []
    for token in re.findall(r"`([^`]+)`", row.data):
        m = re.fullmatch(r"(.*)\{(.*)\}(.*)", token)
        names = [m.group(1) + x + m.group(3) for x in m.group(2).split(",")] if m else [token]
        out += [REPO / n.rstrip("/") for n in names]
    return out


def _decimals(s: str) -> int:
    return len(s.split(".")[1]) if "." in s else 0


def _rounds_to(shown: str, value: float, value_decimals: int) -> bool:
    """`shown` is `value` rounded to shown's decimals (value itself printed to value_decimals)."""
    return abs(float(shown) - value) <= 0.5 * 10 ** -_decimals(shown) + 0.5 * 10 ** -value_decimals + 1e-9


def _results(folder: Path) -> list[dict[str, str]]:
    p = folder / "results.csv"
    return read_results(p)[1] if p.is_file() else []


def _mds(p: Path) -> list[Path]:
    return sorted(p.glob("*.md")) if p.is_dir() else [p] if p.suffix == ".md" else []


def intervals(paths: list[Path]) -> list[tuple[float, float, float, int]]:
    """(value, low, high, decimals printed) of every interval in the folders' results.csv rows and .md files."""
    out: list[tuple[float, float, float, int]] = []
    for p in paths:
        for r in _results(p):
            for k in r:
                try:
                    out.append((float(r[k]), float(r[f"{k}_lo"]), float(r[f"{k}_hi"]), 9))
                except (KeyError, ValueError):
                    continue
        for md in _mds(p):
            for m in INTERVAL.finditer(md.read_text(encoding="utf-8")):
                d = max(_decimals(g) for g in m.groups())
                out.append((float(m.group(1)), float(m.group(2)), float(m.group(3)), d))
    return out


def ratios(paths: list[Path]) -> list[tuple[float, int]]:
    out: list[tuple[float, int]] = []
    for p in paths:
        out += [(float(r["ratio"]), 9) for r in _results(p) if r.get("ratio")]
        for md in _mds(p):
            out += [(float(m.group(1)), _decimals(m.group(1))) for m in MD_RATIO.finditer(md.read_text("utf-8"))]
    return out


def ks(folder: Path) -> set[int]:
    """The --n-expert-used values a campaign folder's cells run."""
    p = folder / "manifest.json"
    if not p.is_file():
        return set()
    cells = json.loads(p.read_text(encoding="utf-8")).get("campaign", {}).get("cells", [])
    return {int(c["flags"]["--n-expert-used"]) for c in cells if "--n-expert-used" in c.get("flags", {})}


def test_the_table_is_there():
    assert len(ROWS) >= 20


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_every_cited_path_exists(row):
    paths = cited(row)
    assert paths, "the row cites no folder"
    assert [p for p in paths if not p.exists()] == []


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_every_interval_is_in_a_cited_folder(row):
    found = intervals(cited(row))
    missing = [m.group(0) for m in INTERVAL.finditer(row.answer)
               if not any(_rounds_to(m.group(1), v, d) and _rounds_to(m.group(2), lo, d)
                          and _rounds_to(m.group(3), hi, d) for v, lo, hi, d in found)]
    assert missing == [], f"not in {[str(p.relative_to(REPO)) for p in cited(row)]}"


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_every_bare_ratio_is_in_a_cited_folder(row):
    found = ratios(cited(row))
    missing = [m.group(0) for m in BARE_RATIO.finditer(row.answer)
               if not any(_rounds_to(m.group(1), v, d) for v, d in found)]
    assert missing == [], f"not in {[str(p.relative_to(REPO)) for p in cited(row)]}"


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_every_k_a_cited_folder_runs_is_named(row):
    named = {int(k) for k in K.findall(row.question + row.answer)}
    run = set().union(*(ks(p) for p in cited(row) if p.is_dir()))
    assert run <= named, f"the row's folders run --n-expert-used {sorted(run)}; it names {sorted(named)}"
    assert named <= run, f"the row names --n-expert-used {sorted(named - run)}, which no cited folder runs"


def test_the_figure_check_catches_a_wrong_figure():
    row = next(r for r in ROWS if "`bench-data/2026-12-03-mgmt-30b-replay-quiet/`" in r.data)
    found = intervals(cited(row))
    assert any(_rounds_to("32.84", v, d) and _rounds_to("24.66", lo, d) and _rounds_to("43.75", hi, d)
               for v, lo, hi, d in found)
    assert not any(_rounds_to("32.84", v, d) and _rounds_to("25.66", lo, d) and _rounds_to("43.75", hi, d)
                   for v, lo, hi, d in found)


COMMITTED_RESULTS = sorted((REPO / "bench-data").glob("*/results.csv"))


def _readme_code(start: str) -> str:
    code = re.findall("`(" + re.escape(start) + "[^`]*)`", README.replace("\n", " "))
    assert len(code) == 1, f"the README shows one `{start}...` read of results.csv"
    return code[0]


@pytest.mark.parametrize("path", COMMITTED_RESULTS, ids=lambda p: p.parent.name)
def test_results_csv_reads_as_the_readme_shows(path):
    pd = pytest.importorskip("pandas")
    want = read_results(path)[1]
    frame = eval(_readme_code("pd.read_csv("), {"pd": pd, "path": path})  # noqa: S307 (the README's own line)
    frame = frame.astype(object).where(frame.notna(), "")
    assert list(frame.columns) == list(want[0]) and len(frame) == len(want)
    assert [str(v) for v in frame["cell"]] == [r["cell"] for r in want]
    assert all(_same(a, b) for r, w in zip(frame.to_dict("records"), want, strict=True) for a, b in
               ((r[k], w[k]) for k in w))
    with open(path, newline="", encoding="utf-8"):
        rows = list(eval(_readme_code("csv.DictReader("), {"csv": csv, "path": path}))  # noqa: S307
    assert rows == want


def _same(a: object, b: str) -> bool:
    """pandas' value (typed; "" for its NaN) and the stored text: the same value (pandas reads None as NaN)."""
    if a == "":
        return b in ("", "None")
    if isinstance(a, str | bool):
        return str(a) == b
    try:
        return float(a) == float(b)  # type: ignore[arg-type]
    except ValueError:
        return False
