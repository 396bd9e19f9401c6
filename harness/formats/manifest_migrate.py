"""`bmoe-bench report DIR --migrate`: an older manifest rewritten at the current version (harness.formats.manifest),
with the hashes of its runs' raw files as they are now."""

from __future__ import annotations

from pathlib import Path

from harness.errors import UserError
from harness.formats.manifest import (
    VERSION,
    hash_files,
    hashes_removed,
    load_manifest,
    removed_message,
    run_dir,
    save_manifest,
)


def migrate_folder(folder: Path | str) -> tuple[int, list[str]]:
    """Rewrite a folder's manifest at VERSION, recording the hashes of the raw files of every finished run
    that has none, as they are now (a v1 file only: in a later one a missing hash was removed, and hashing
    the files now would hide a change). Returns (the version it had, the runs hashed)."""
    m = load_manifest(folder)
    old = m.upgraded_from or m.version
    if hashes_removed(m):
        raise UserError(f"{folder}: {removed_message(hashes_removed(m))}")
    hashed = []
    for r in m.runs:
        if r.finished and r.sha256 is None:
            d = run_dir(folder, r.run_id)
            if not d.is_dir():
                raise UserError(f"{d}: run {r.run_id} is recorded as {r.status} but its folder is missing; "
                                f"restore it before migrating")
            r.sha256 = hash_files(d)
            hashed.append(r.run_id)
    if hashed or old != VERSION:
        save_manifest(folder, m)
    return old, hashed
