"""The campaign folder on disk: bench-data/<YYYY-MM-DD>-<campaign>/ with the campaign file as given, the
resolved plan, a versioned manifest rewritten atomically after every run, and one folder per run.

    campaign.yaml        the campaign file, verbatim
    manifest.json        format bmoe-manifest v1: engine, git commit, target, plan, every run's record
    runs/<run_id>/       metrics.csv, state.jsonl (device samples ~1/s), engine.log, outcome.json
    results.csv, findings.md, plots/   written by `bmoe-bench report`

A run is written under runs/.<run_id>.tmp/ and renamed into place when it ends, its outcome.json inside,
so a folder either holds a whole run or none; the manifest is then updated (tmp name + rename)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from harness.errors import UserError

MANIFEST = "manifest.json"
FORMAT = "bmoe-manifest"
VERSION = 1


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, obj: object) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=False) + "\n")


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1000):03d}Z"


def load_manifest(folder: Path) -> dict:
    p = Path(folder) / MANIFEST
    try:
        m = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{folder}: no {MANIFEST}; is this a campaign folder under bench-data/?") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if m.get("format") != FORMAT:
        raise UserError(f"{p}: not a {FORMAT} file")
    v = m.get("version")
    if not isinstance(v, int) or v > VERSION:
        raise UserError(f"{p}: manifest version {v} is newer than this bmoe-bench understands ({VERSION}); "
                        f"upgrade bmoe")
    return m


def save_manifest(folder: Path, m: dict) -> None:
    atomic_write_json(Path(folder) / MANIFEST, m)


def new_folder(root: Path, name: str, t: float) -> Path:
    day = time.strftime("%Y-%m-%d", time.gmtime(t))
    base = Path(root) / f"{day}-{name}"
    p, n = base, 2
    while p.exists():
        p = base.with_name(f"{base.name}-{n}")
        n += 1
    p.mkdir(parents=True)
    (p / "runs").mkdir()
    return p


def find_resumable(root: Path, name: str, plan_hash: str, *, with_failed: bool = False) -> Path | None:
    """The newest unfinished folder of this campaign with the same plan, if any (with_failed: also a
    complete one that has failed runs)."""
    root = Path(root)
    if not root.is_dir():
        return None
    found = []
    for d in root.iterdir():
        if not d.is_dir() or not (d / MANIFEST).is_file() or f"-{name}" not in d.name:
            continue
        try:
            m = load_manifest(d)
        except UserError:
            continue
        if m.get("campaign", {}).get("name") != name or m.get("plan_hash") != plan_hash:
            continue
        failed = any(r.get("status") == "failed" for r in m.get("runs", []))
        if m.get("status") != "complete" or (with_failed and failed):
            found.append(d)
    return sorted(found)[-1] if found else None


def run_dir(folder: Path, run_id: str) -> Path:
    return Path(folder) / "runs" / run_id


def tmp_run_dir(folder: Path, run_id: str) -> Path:
    return Path(folder) / "runs" / f".{run_id}.tmp"


def clear_tmp(folder: Path) -> list[str]:
    """Remove half-written run folders left by an interrupted campaign."""
    gone = []
    for d in (Path(folder) / "runs").glob(".*.tmp"):
        shutil.rmtree(d, ignore_errors=True)
        gone.append(d.name)
    return gone


def commit_run(folder: Path, run_id: str, outcome: dict) -> Path:
    """Write outcome.json into the tmp run folder and rename it into place."""
    tmp = tmp_run_dir(folder, run_id)
    atomic_write_json(tmp / "outcome.json", outcome)
    final = run_dir(folder, run_id)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def reset_failed(m: dict) -> list[str]:
    """Mark failed runs pending again, keeping each old record under `previous_attempts`."""
    again = []
    for r in m["runs"]:
        if r.get("status") == "failed":
            old = {k: v for k, v in r.items() if k not in ("run_id", "round", "cell", "position",
                                                            "previous_attempts")}
            keep = {k: r[k] for k in ("run_id", "round", "cell", "position")}
            prev = r.get("previous_attempts", []) + [old]
            r.clear()
            r.update(keep, status="pending", previous_attempts=prev)
            again.append(r["run_id"])
    return again


def adopt_orphans(folder: Path, m: dict) -> list[str]:
    """Runs whose folder was committed but the manifest not updated (killed in between): take their
    outcome.json into the manifest, so they are not run again."""
    adopted = []
    for r in m["runs"]:
        if r["status"] != "pending":
            continue
        oc = run_dir(folder, r["run_id"]) / "outcome.json"
        if oc.is_file():
            r.update(json.loads(oc.read_text(encoding="utf-8")))
            adopted.append(r["run_id"])
    return adopted
