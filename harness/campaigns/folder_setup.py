"""Choosing a campaign folder's way in, shared by a one-device campaign (harness.campaigns.runner) and a
fleet one (harness.campaigns.fleet.run): a new folder made whole (campaign file, questions, manifest) or
not at all; a folder resumed (its half-written run dropped, orphans adopted, failed runs reset on
--retry-failed), said in one line; and the session that starts on it, recorded before its first run."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from harness.campaigns import store
from harness.campaigns.questions import write_prompts_file
from harness.campaigns.validate import Plan
from harness.formats.files import copy_file
from harness.formats.folder import CAMPAIGN_FILE
from harness.formats.manifest import Manifest, SessionRecord, save_manifest


def create(root: Path, plan: Plan, m: Manifest, now: float) -> Path:
    """A new folder for this campaign holding its file, its questions (quality) and its manifest."""
    c = plan.campaign

    def fill(d: Path) -> None:
        copy_file(c.source, d / CAMPAIGN_FILE)
        if c.quality is not None:
            write_prompts_file(d, c.quality)
        save_manifest(d, m)

    return store.new_folder(root, c.name, now, fill)


def reopen(folder: Path, m: Manifest, name: str, retry_failed: bool, console: Console) -> None:
    """Resume `folder`: drop its half-written run, adopt runs committed after the last manifest save, reset
    the failed runs on --retry-failed; say what was done."""
    gone = store.clear_tmp(folder)
    adopted = store.adopt_orphans(folder, m)
    if retry_failed:
        again = store.reset_failed(m)
        console.print(f"retrying {len(again)} failed run(s): {' '.join(again)}")
    done = sum(r.finished for r in m.runs)
    hot = sum(r.deferred for r in m.runs)  # left unrun by a strict temperature target: tried again now
    console.print(f"campaign {name}: resuming {folder} ({done}/{len(m.runs)} runs finished"
                  f"{f', {hot} deferred earlier (the device was hot)' if hot else ''}"
                  f"{', dropped partial ' + ', '.join(gone) if gone else ''}"
                  f"{', adopted ' + ', '.join(adopted) if adopted else ''})", highlight=False)


def start_session(folder: Path, m: Manifest, now: float, git: dict) -> None:
    """The session starts: status running, its start time and the harness's commit in the manifest."""
    m.status = "running"
    m.sessions.append(SessionRecord(start=store.iso(now), end=None, **git))
    save_manifest(folder, m)
