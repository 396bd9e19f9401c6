"""Regenerate a campaign folder's report from its raw files, or check that the committed one matches.

`build_report` returns the texts (findings.md, results.csv) and plot bytes without writing anything;
`write_report` writes them (tmp name + rename); `check_report` lists the files that are not as they
should be: raw files of a run changed since it was committed (their sha256 in the manifest), and report
files whose committed content differs from what the raw data gives (findings.md, results.csv, and in a
quality campaign grades.json, the replies regraded), every expected plot missing or not a whole PNG (plots
depend on the matplotlib build, so their bytes are not compared), and temporary files left anywhere in the
folder (a write cut short)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.errors import UserError
from harness.formats.files import atomic_write_bytes, atomic_write_text, is_temp_name, not_writable
from harness.formats.folder import FINDINGS, GRADES_FILE, PLOTS_DIR, RESULTS, RUNS
from harness.formats.folder_guard import MAX_RAW, read_bytes, read_text
from harness.formats.grades import grades_text
from harness.formats.manifest import load_manifest, raw_file_changes, unhashed_runs
from harness.formats.results_csv import results_text
from harness.report.collect import load_campaign_data
from harness.report.fidelity import PLOT as KLD_PLOT
from harness.report.fidelity import cell_fidelity, fidelity_section
from harness.report.findings import render_findings
from harness.report.heldout import cell_heldout, heldout_section
from harness.report.peers import check_engines
from harness.report.plots import all_plots
from harness.report.quality import grade_folder, quality_section
from harness.report.results import compute_results, results_rows
from harness.report.traced import TIMELINE, shown

CHECKED = (FINDINGS, RESULTS)  # and grades.json in a quality campaign
PLOTS = ("tok_s.png", "split.png", "tokens.png")  # what all_plots gives: checked present and whole
_PNG_HEAD = b"\x89PNG\r\n\x1a\n"
_PNG_TAIL = b"IEND\xaeB`\x82"


@dataclass
class Report:
    texts: dict[str, str]  # file name -> content
    plots: dict[str, bytes]  # plots/<name> -> PNG
    plot_names: tuple[str, ...] = PLOTS  # the plots the folder must have (a traced campaign: the timeline too)


def build_report(folder: Path | str, *, with_plots: bool = True) -> Report:
    folder = Path(folder)
    data = load_campaign_data(folder)
    check_engines(data)  # an engines axis compares only cells that differ by the engine alone
    res = compute_results(data)
    prev_path = folder / FINDINGS
    previous = _text(prev_path)
    grades = grade_folder(data)  # None unless a quality campaign
    quality = quality_section(data, grades) if grades is not None else None
    fid = cell_fidelity(data)  # None unless a fidelity campaign
    held = cell_heldout(data) if fid is not None else None  # None unless its records have log-probabilities
    findings = render_findings(data, res, previous, quality,
                               fidelity_section(data, res, fid) + (heldout_section(data, held) if held else [])
                               if fid is not None else None)
    csv = results_text(results_rows(res))
    plots = all_plots(data, res, fid) if with_plots else {}
    texts = {FINDINGS: findings, RESULTS: csv}
    if grades is not None:
        texts[GRADES_FILE] = grades_text(grades)
    names = (*PLOTS, *([TIMELINE] if shown(data) is not None else []), *([KLD_PLOT] if fid else []))
    return Report(texts=texts, plots=plots, plot_names=names)


def write_report(folder: Path | str) -> Report:
    folder = Path(folder)
    rep = build_report(folder)
    for name, text in rep.texts.items():
        atomic_write_text(folder / name, text)
    try:
        (folder / PLOTS_DIR).mkdir(exist_ok=True)
    except OSError as e:
        raise not_writable(folder / PLOTS_DIR, e) or e from None
    for name, png in rep.plots.items():
        atomic_write_bytes(folder / PLOTS_DIR / name, png)
    return rep


def check_report(folder: Path | str) -> list[str]:
    """Paths (relative to the folder) of the raw files changed, missing or added since their run was
    committed, then of the checked report files that are missing or differ from a fresh build."""
    folder = Path(folder)
    bad = raw_file_changes(folder, load_manifest(folder))
    rep = build_report(folder, with_plots=False)
    for name in [*CHECKED, *(n for n in rep.texts if n not in CHECKED)]:
        p = folder / name
        if _text(p) != rep.texts[name]:
            bad.append(name)
    for name in rep.plot_names:
        if not _whole_png(folder / PLOTS_DIR / name):
            bad.append(f"{PLOTS_DIR}/{name}")
    bad += stray_temp_files(folder)
    return bad


def _text(p: Path) -> str | None:
    """A report file of the folder as it is (None: missing, or no file the report writes: not a plain file, or
    far larger), read with a bound (harness.formats.folder_guard)."""
    try:
        return read_text(p, MAX_RAW, errors="replace")
    except (FileNotFoundError, UserError):
        return None


def _whole_png(p: Path) -> bool:
    try:
        data = read_bytes(p, MAX_RAW)
    except (OSError, UserError):
        return False
    return data.startswith(_PNG_HEAD) and data.endswith(_PNG_TAIL)


def stray_temp_files(folder: Path) -> list[str]:
    """Temporary files and folders (.NAME.tmp, .NAME.<pid>.tmp) anywhere in the folder, relative to it."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob(".*") if is_temp_name(p.name))


def check_message(folder: Path | str, bad: list[str]) -> str:
    """The one-line error for what check_report found."""
    tmp = [b for b in bad if is_temp_name(Path(b).name)]
    raw = [b for b in bad if b.startswith(f"{RUNS}/") and b not in tmp]
    rep = [b for b in bad if b not in raw and b not in tmp]
    parts = []
    if raw:
        parts.append(f"{', '.join(raw)} changed since the run was committed (sha256 in manifest.json): restore "
                     f"them (git checkout -- {folder}), or rerun the runs if the change is meant")
    if rep:
        parts.append(f"{', '.join(rep)} differ from what the raw data gives, or are missing or cut short; run "
                     f"`bmoe-bench report {folder}` and commit the result")
    if tmp:
        parts.append(f"{', '.join(tmp)}: temporary, left by a write cut short; delete them (a resumed "
                     f"`bmoe-bench run` clears those under runs/)")
    return f"{folder}: " + "; ".join(parts)


def unverified_note(folder: Path | str) -> str | None:
    """Why the raw files of some runs could not be checked (a manifest from before file hashes), if so."""
    m = load_manifest(folder)
    runs = unhashed_runs(m)
    if not runs:
        return None
    return (f"{len(runs)} run(s) have no recorded file hashes (manifest v{m.upgraded_from or m.version}): "
            f"`bmoe-bench report {folder} --migrate` records them")
