"""The tamper check's reading side: which files a manifest's sha256 entries may name, and hashing them with
bounded work (harness.formats.manifest records the hashes; `check` and `report --check` compare them).

A manifest is untrusted input, so a name in a sha256 table is a path only once it is found to be one of the
folder's own: a run's entries are relative paths under its run folder (`metrics.csv`, `attempt-1/engine.log`:
`checked_names`), the fidelity reference's are the two file names beside the manifest. No name may be absolute
or climb with `..`; any other is refused when the manifest is read, so nothing outside the folder is opened.

Each file is hashed through folder_guard.sha256_plain (no link followed, no FIFO opened), refused past
`MAX_FILE` bytes, and one folder's check hashes at most `MAX_TOTAL` bytes in all: a sparse 200 GB file, or a
thousand large ones, end the check with one line instead of hanging it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UserError
from harness.formats.folder_guard import MAX_DEPTH, sha256_plain, shown

MAX_FILE = 2**30  # one raw file (the largest committed: an 8 MB route trace, a 5 MB fidelity reference)
MAX_TOTAL = 8 * 2**30  # every file one check hashes
MAX_NAMES = 10_000  # entries of one sha256 table (a run writes about ten files)
_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")  # a file or folder name bmoe-bench writes


def checked_names(v: dict[str, str] | None) -> dict[str, str] | None:
    """A run's sha256 table, when every key is a relative path of plain names (no `..`, nothing absolute)."""
    if v is None:
        return v
    if len(v) > MAX_NAMES:
        raise ValueError(f"{len(v)} files hashed, more than the {MAX_NAMES} a run can have")
    for name in v:
        parts = name.split("/")
        if len(parts) > MAX_DEPTH or not all(_PART.fullmatch(p) for p in parts):
            raise ValueError(f"{shown(name)} is not a file of the run's folder (a relative path of plain names)")
    return v


def only_names(allowed: tuple[str, ...]):  # noqa: ANN201 (a pydantic validator)
    """A validator of a sha256 table whose keys may only be the given file names."""
    def check(v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if k not in allowed]
        if bad:
            raise ValueError(f"{shown(bad[0])} is not one of the files it hashes ({', '.join(allowed)})")
        return v
    return check


@dataclass
class Budget:
    """Bytes a check may still hash (MAX_TOTAL to start with)."""

    folder: Path
    left: int = MAX_TOTAL

    def hash(self, path: Path) -> str:
        size = path.lstat().st_size  # FileNotFoundError: the caller's missing file
        if MAX_FILE >= size > self.left:  # one file too large is named as such by sha256_plain
            raise UserError(f"{self.folder}: its raw files hold more than {MAX_TOTAL // 2**30} GiB to hash (at "
                            f"{path.relative_to(self.folder)}), far beyond any campaign bmoe-bench writes; refused")
        h = sha256_plain(path, MAX_FILE)
        self.left -= size
        return h


def hash_files(d: Path, budget: Budget | None = None) -> dict[str, str]:
    """sha256 of every file under a run folder, by path relative to it (sorted)."""
    b = budget or Budget(d)
    return {p.relative_to(d).as_posix(): b.hash(p) for p in sorted(d.rglob("*")) if not p.is_dir()}


def changed(folder: Path, rel: str, recorded: dict[str, str], budget: Budget, *, every_file: bool) -> list[str]:
    """Paths (relative to folder) of the files under folder/rel whose sha256 differs from `recorded`: changed or
    missing, and with every_file also those there but not recorded (a run folder holds only what was hashed)."""
    d = folder / rel if rel else folder
    if every_file:
        now = hash_files(d, budget) if d.is_dir() else {}
    else:
        now = {}
        for name in recorded:
            try:
                now[name] = budget.hash(d / name)
            except FileNotFoundError:
                pass
    prefix = f"{rel}/" if rel else ""
    return [f"{prefix}{n}" for n in sorted(set(recorded) | set(now)) if recorded.get(n) != now.get(n)]
