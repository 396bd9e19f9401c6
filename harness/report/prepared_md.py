"""findings.md's line per prepared device: what a campaign's `prepare:` did on it, read from the folder's journals
(harness.formats.prepared: prepared/<device>.json), each validated as any file of a folder is."""

from __future__ import annotations

from pathlib import Path

from harness.errors import UserError
from harness.formats import prepared as fmt


def preparation_lines(folder: Path) -> list[str]:
    """One Setup line per device the campaign prepared (none without `prepare:`)."""
    out = []
    for p in fmt.journals(folder):
        try:
            j = fmt.load(p)
        except UserError as e:
            out.append(f"- **Device preparation**: {p.name} is unreadable ({e}).")
            continue
        left = "" if j.state == "restored" else (f" **Not restored**: `bmoe-bench devices --restore {folder}` puts "
                                                 f"it back.")
        out.append(f"- **Device preparation**, {j.serial}: {j.summary()}.{left}")
    return out


def journal_states(folder: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """([(device serial, journal state)], [one problem line per journal that cannot be read]) for `check`."""
    states, bad = [], []
    for p in fmt.journals(folder):
        try:
            j = fmt.load(p)
        except UserError as e:
            bad.append(f"{fmt.DIR}/{p.name}: unreadable device-preparation journal ({e})")
            continue
        states.append((j.serial, j.state))
    return states, bad
