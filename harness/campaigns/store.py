"""The campaign folder on disk: bench-data/<YYYY-MM-DD>-<campaign>/ with the campaign file as given, a
versioned manifest (harness.formats.manifest) rewritten atomically after every run, and one folder per run.

    campaign.yaml        the campaign file, verbatim
    manifest.json        bmoe-manifest: engine, git commit, target, plan, every run's record and file hashes
    runs/<run_id>/       metrics.csv, state.jsonl (device samples ~1/s), engine.log, outcome.json; in a quality
                         campaign also replies.jsonl (harness.formats.replies)
    prompts.jsonl        a quality campaign's questions, as handed to every run
    results.csv, findings.md, plots/   written by `bmoe-bench report` (and grades.json in a quality campaign)

A run is written under runs/.<run_id>.tmp/ and renamed into place when it ends, its outcome.json inside,
so a folder either holds a whole run or none; the manifest is then updated (tmp name + rename) with the
run's outcome and the sha256 of each of its files."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from harness.errors import UserError
from harness.formats.manifest import MANIFEST, RUNS, Manifest, hash_files, load_manifest, run_dir
from harness.formats.outcome import OUTCOME_FILE, Outcome, read_outcome, write_outcome


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1000):03d}Z"


def new_folder(root: Path, name: str, t: float) -> Path:
    day = time.strftime("%Y-%m-%d", time.gmtime(t))
    base = Path(root) / f"{day}-{name}"
    p, n = base, 2
    while p.exists():
        p = base.with_name(f"{base.name}-{n}")
        n += 1
    p.mkdir(parents=True)
    (p / RUNS).mkdir()
    return p


def _folders(root: Path, name: str) -> list[tuple[Path, Manifest]]:
    """Every readable folder of this campaign under root, oldest name first."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for d in sorted(root.iterdir()):
        if not d.is_dir() or not (d / MANIFEST).is_file() or f"-{name}" not in d.name:
            continue
        try:
            m = load_manifest(d)
        except UserError:
            continue
        if m.campaign.name == name:
            out.append((d, m))
    return out


def find_resumable(root: Path, name: str, plan_hash: str, *, with_failed: bool = False) -> Path | None:
    """The newest unfinished folder of this campaign with the same plan, if any (with_failed: also a
    complete one that has failed runs)."""
    found = [d for d, m in _folders(root, name) if m.plan_hash == plan_hash and (
        m.status != "complete" or with_failed and any(r.status == "failed" for r in m.runs))]
    return found[-1] if found else None


def unfinished_elsewhere(root: Path, name: str, plan_hash: str) -> list[tuple[Path, list[str]]]:
    """Unfinished folders of this campaign with another plan (say, other --set overrides): each with its
    overrides, so the user can be told how to resume it."""
    return [(d, m.campaign.overrides) for d, m in _folders(root, name)
            if m.plan_hash != plan_hash and m.status != "complete"]


def tmp_run_dir(folder: Path, run_id: str) -> Path:
    return Path(folder) / RUNS / f".{run_id}.tmp"


def clear_tmp(folder: Path) -> list[str]:
    """Remove half-written run folders left by an interrupted campaign."""
    gone = []
    for d in (Path(folder) / RUNS).glob(".*.tmp"):
        shutil.rmtree(d, ignore_errors=True)
        gone.append(d.name)
    return gone


def commit_run(folder: Path, run_id: str, outcome: Outcome) -> dict[str, str]:
    """Write outcome.json into the tmp run folder, hash every file there, and rename it into place.
    Returns the hashes (file name -> sha256) for the manifest."""
    tmp = tmp_run_dir(folder, run_id)
    write_outcome(tmp / OUTCOME_FILE, outcome)
    hashes = hash_files(tmp)
    final = run_dir(folder, run_id)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return hashes


def reset_failed(m: Manifest) -> list[str]:
    """Mark failed runs pending again, keeping each old record under `previous_attempts`."""
    again = []
    for i, r in enumerate(m.runs):
        if r.status == "failed":
            m.runs[i] = r.retry()
            again.append(r.run_id)
    return again


def adopt_orphans(folder: Path, m: Manifest) -> list[str]:
    """Runs whose folder was committed but the manifest not updated (killed in between): take their
    outcome.json and file hashes into the manifest, so they are not run again."""
    adopted = []
    for i, r in enumerate(m.runs):
        if r.finished:
            continue
        d = run_dir(folder, r.run_id)
        if (d / OUTCOME_FILE).is_file():
            m.runs[i] = r.finish(read_outcome(d / OUTCOME_FILE), hash_files(d))
            adopted.append(r.run_id)
    return adopted
