"""A generated table in the README between two marker lines: finding it, and the small command that prints it
or rewrites it in place (`--readme-table` / `--update-readme README.md`). Used by the engine's flag table
(harness.engine.config.doc) and the bench command table (harness.bench_doc).

Stays at the root because the engine's flag table and the bench command table both use it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from harness.errors import UserError


def find(text: str, begin: str, end: str, what: str, path: str = "README.md") -> tuple[int, int]:
    """(start, end) of the section from `begin` through `end`; UserError when its markers are missing."""
    a, b = text.find(begin), text.find(end)
    if a < 0 or b < a:
        raise UserError(f"{path}: no generated {what} (the markers {begin!r} ... {end!r})")
    return a, b + len(end)


def main(argv: list[str], *, prog: str, description: str, what: str, section: Callable[[], str],
         begin: str, end: str) -> int:
    p = argparse.ArgumentParser(prog=prog, allow_abbrev=False, description=description)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--readme-table", action="store_true", help=f"print the README's {what}")
    g.add_argument("--update-readme", metavar="README", help="rewrite the table between its markers in place")
    ns = p.parse_args(argv)
    if ns.readme_table:
        print(section())
        return 0
    path = Path(ns.update_readme)
    try:
        text = path.read_text()
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e.strerror}); give the README's path") from None
    a, b = find(text, begin, end, what, str(path))
    path.write_text(text[:a] + section() + text[b:])
    return 0
