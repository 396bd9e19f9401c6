"""Regenerate a campaign folder's report from its raw files, or check that the committed one matches.

`build_report` returns the texts (findings.md, results.csv) and plot bytes without writing anything;
`write_report` writes them (tmp name + rename); `check_report` lists the files whose committed content
differs from what the raw data gives (findings.md and results.csv: plots depend on the matplotlib
build, so they are regenerated but not compared)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.campaigns.store import atomic_write_text
from harness.report.collect import load_campaign_data
from harness.report.findings import render_findings
from harness.report.plots import all_plots
from harness.report.results import compute_results, results_frame

CHECKED = ("findings.md", "results.csv")


@dataclass
class Report:
    texts: dict[str, str]  # file name -> content
    plots: dict[str, bytes]  # plots/<name> -> PNG


def build_report(folder: Path | str, *, with_plots: bool = True) -> Report:
    folder = Path(folder)
    data = load_campaign_data(folder)
    res = compute_results(data)
    prev_path = folder / "findings.md"
    previous = prev_path.read_text(encoding="utf-8") if prev_path.is_file() else None
    findings = render_findings(data, res, previous)
    csv = results_frame(res).to_csv(index=False, float_format="%.6g", lineterminator="\n")
    plots = all_plots(data, res) if with_plots else {}
    return Report(texts={"findings.md": findings, "results.csv": csv}, plots=plots)


def write_report(folder: Path | str) -> Report:
    folder = Path(folder)
    rep = build_report(folder)
    for name, text in rep.texts.items():
        atomic_write_text(folder / name, text)
    (folder / "plots").mkdir(exist_ok=True)
    for name, png in rep.plots.items():
        tmp = folder / "plots" / f".{name}.tmp"
        tmp.write_bytes(png)
        tmp.replace(folder / "plots" / name)
    return rep


def check_report(folder: Path | str) -> list[str]:
    """Names of checked files that are missing or differ from a fresh build."""
    folder = Path(folder)
    rep = build_report(folder, with_plots=False)
    bad = []
    for name in CHECKED:
        p = folder / name
        if not p.is_file() or p.read_text(encoding="utf-8") != rep.texts[name]:
            bad.append(name)
    return bad
