"""A campaign folder's file names are declared once, in harness/formats/folder.py: no other module of harness/
spells one as a string literal of its own (prose inside a longer string, such as a help text, is not a name)."""

from __future__ import annotations

import ast
from pathlib import Path

from harness.formats import folder

REPO = Path(__file__).resolve().parents[2]
# the file names (with a dot); "runs" and "plots" are words too
NAMES = {v for k, v in vars(folder).items() if k.isupper() and isinstance(v, str) and "." in v}


def literals(path: Path) -> set[str]:
    """Every whole string constant of the module (f-string parts included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def test_folder_names_are_declared_once():
    assert {"manifest.json", "metrics.csv", "engine.log", "state.jsonl", "outcome.json"} <= NAMES
    spelt = sorted(f"{rel}: {name!r}" for p in (REPO / "harness").rglob("*.py")
                   if p.name != "folder.py" or p.parent.name != "formats"
                   for rel in [str(p.relative_to(REPO))] for name in literals(p) & NAMES)
    assert not spelt, "use harness.formats.folder's constant instead:\n  " + "\n  ".join(spelt)


def test_the_checker_sees_a_literal(tmp_path: Path):
    p = tmp_path / "m.py"
    p.write_text('LOG = "engine.log"\nHELP = "see engine.log"\nx = f"{LOG}/metrics.csv"\n')
    assert literals(p) & NAMES == {"engine.log"}
