"""The import rules that tests/engine/test_structure.py holds harness/ to, beyond cycles and layers:

- every package of the engine, nested ones too, says in its docstring what it may import (`May import: a, b.`: engine
  layers and modules by their name under harness.engine, other modules of harness by their dotted name; `nothing`
  for none), and every import of harness/ from a module of the package is either of the package itself or on that list;
  so is every package outside the engine that has such a list (harness.hub);
- the harness outside the engine imports from the engine only the names the engine exports for it
  (`from harness.engine import NAME`, NAME in `harness.engine.__all__`).

Imports are read with `ast`, those inside functions included. An import names its target as written
(`from a.b import c` names a.b.c, a module or a name in one), and a list's entry allows the target it names and
everything under it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.helpers.import_graph import imported, modules

ENGINE = "harness.engine"
_ENTRY = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def import_targets(path: Path, module: str) -> list[str]:
    """Every harness name one module imports, in file order: `import a.b` -> a.b, `from a import b, c` -> a.b, a.c."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        names = imported(node, module, path.name == "__init__.py")
        if isinstance(node, ast.ImportFrom):
            names = names[:-1]  # the last one is the base, named by each of the others already
        out += [n for n in names if n == "harness" or n.startswith("harness.")]
    return out


def may_import(doc: str, mods: dict[str, Path], engine: bool = True) -> list[str] | str:
    """The absolute names a docstring's `May import:` sentence allows, or why it cannot be read. Parentheses are
    remarks; the sentence ends at a period followed by a space or the end. In an engine package's list a name that
    does not start with harness is one under harness.engine; elsewhere it is a third-party package (kept as written:
    only imports of harness are checked)."""
    at = doc.find("May import:")
    if at < 0:
        return "no 'May import:' line"
    text = " ".join(re.sub(r"\([^()]*\)", "", doc[at + len("May import:"):]).split())
    sentence = re.split(r"\.(?:\s|$)", text, maxsplit=1)[0]
    entries = [e.strip() for e in sentence.split(",")]
    if entries[0].lower().startswith("nothing"):
        return []
    out = []
    for e in entries:
        if not _ENTRY.fullmatch(e):
            return f"cannot read {e!r} in 'May import: {sentence}' (write names separated by commas)"
        name = e if e == "harness" or e.startswith("harness.") else f"{ENGINE}.{e}"
        if not engine and name != e:
            out.append(e)
            continue
        owner = name
        while owner and owner not in mods:
            owner = owner.rpartition(".")[0]
        if not owner or name.count(".") - owner.count(".") > 1 or owner == ENGINE != name:  # an engine layer, at least
            return f"'May import: {sentence}' names {e!r}: no such module or package"
        out.append(name)
    return out


def _under(name: str, allowed: str) -> bool:
    return name == allowed or name.startswith(allowed + ".")


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def may_import_violations(root: Path, layers: tuple[str, ...]) -> list[str]:
    """One line per package whose list is unreadable, or names a layer above the package's own, or is missing from an
    engine package (a package outside the engine need not have one), and per import of harness from a module that is
    neither of its package nor on the package's list."""
    mods = modules(root)
    rank = {f"{ENGINE}.{name}": i for i, name in enumerate(layers)}

    def layer(name: str) -> str | None:
        return ".".join(name.split(".")[:3]) if name.startswith(ENGINE + ".") else None

    lists: dict[str, list[str]] = {}
    bad = []
    for m, path in mods.items():
        if path.name != "__init__.py":
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        if not _under(m, ENGINE) and "May import:" not in doc:
            continue
        got = may_import(doc, mods, engine=_under(m, ENGINE))
        where = path.relative_to(root)
        if isinstance(got, str):
            bad.append(f"{where}: {got}")
            continue
        mine = layer(m)
        bad += [f"{where}: 'May import' names {e}, a layer above {mine}" for e in got
                if mine in rank and layer(e) in rank and rank[layer(e)] > rank[mine]]
        lists[m] = got
    for m, path in sorted(mods.items()):
        pkg = _package_of(m, path)
        if pkg not in lists:
            continue  # no list (outside the engine), or its package's list is reported above
        for t in import_targets(path, m):
            if not _under(t, pkg) and not any(_under(t, a) for a in lists[pkg]):
                bad.append(f"{m} imports {t}: not on {pkg}'s 'May import' list "
                           f"({mods[pkg].relative_to(root)})")
    return bad


def facade_violations(root: Path, exported: set[str], exempt: dict[str, set[str]]) -> list[str]:
    """'m imports t' for each import of the engine by a harness module outside it that is not
    `from harness.engine import NAME` with NAME exported (`exempt`: module -> targets it may import besides)."""
    bad = []
    for m, path in sorted(modules(root).items()):
        if _under(m, ENGINE):
            continue
        for t in import_targets(path, m):
            base, _, name = t.rpartition(".")
            if _under(t, ENGINE) and not (base == ENGINE and name in exported) and t not in exempt.get(m, set()):
                bad.append(f"{m} imports {t}")
    return bad
