"""The import structure of harness/: no cycle between files or between subpackages, harness/formats
imports nothing from harness/ but harness.errors, the engine's layers import nothing above them (the order
declared in harness/engine/__init__.py), every engine subpackage says its job, and no module is over 400
lines. Imports are read with `ast` from every module, those inside functions included (a lazy import hides a
cycle from Python, not from this test)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def modules(root: Path, package: str = "harness") -> dict[str, Path]:
    """Dotted module name -> file, for every .py under root/package (a package is its __init__.py)."""
    out = {}
    for p in sorted((root / package).rglob("*.py")):
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _imported(node: ast.AST, module: str, is_pkg: bool) -> list[str]:
    """The dotted names one import statement brings in (`from a import b` gives a.b and a)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: from the module's package, up level - 1 more
        pkg = module.split(".") if is_pkg else module.split(".")[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([node.module] if node.module else []))
    return [f"{base}.{a.name}" for a in node.names] + [base]


def import_graph(root: Path, package: str = "harness") -> dict[str, set[str]]:
    """module -> the modules of `package` it imports anywhere in its body."""
    mods = modules(root, package)

    def owner(name: str) -> str | None:  # the module a dotted name lives in
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for m, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        deps: set[str] = set()
        for node in ast.walk(tree):
            names = _imported(node, m, path.name == "__init__.py")
            if isinstance(node, ast.ImportFrom):  # `from a import b`: module a.b if it is one, else a
                full, base = names[:-1], names[-1]
                hits = [owner(n) for n in full if n in mods]
                deps.update(h for h in hits if h) if hits else deps.add(owner(base) or "")
            else:
                deps.update(o for o in map(owner, names) if o)
        graph[m] = {d for d in deps if d and d != m and d.startswith(package)}
    return graph


def subpackage(module: str) -> str:
    """harness.engine.cache.expert_cache -> harness.engine; a top-level module (harness.errors) is its own node."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, deps in graph.items():
        s = subpackage(m)
        out.setdefault(s, set()).update(subpackage(d) for d in deps if subpackage(d) != s)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a -> b -> ... -> a) per strongly connected component of more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan; the graphs here are small enough to recurse
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_a_cycle(graph, comp) for comp in comps]


def _a_cycle(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """The shortest path from the component's first node back to itself, inside the component."""
    start = min(comp)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w == start:
                    return paths[v] + [start]
                if w in comp and w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{sorted(comp)} is not strongly connected")


def _explain(kind: str, found: list[list[str]]) -> str:
    """One line per tangle: a cycle through it (break every cycle among those modules, not just this one)."""
    return f"import cycles between {kind}:\n" + "\n".join("  " + " -> ".join(c) for c in found)


GRAPH = import_graph(REPO)


def test_no_import_cycle_between_files():
    found = cycles(GRAPH)
    assert not found, _explain("files", found)


def test_no_import_cycle_between_subpackages():
    found = cycles(package_graph(GRAPH))
    assert not found, _explain("subpackages", found)


def test_formats_import_nothing_above_them():
    bad = {m: sorted(d for d in deps if d != "harness.errors" and subpackage(d) != "harness.formats")
           for m, deps in GRAPH.items() if subpackage(m) == "harness.formats"}
    bad = {m: d for m, d in bad.items() if d}
    assert not bad, f"harness/formats imports from above it: {bad}"


def engine_layer(module: str) -> str | None:
    """harness.engine.cache.policies.aged -> cache; harness.engine.compose -> compose; None outside the engine."""
    parts = module.split(".")
    if parts[:2] != ["harness", "engine"] or len(parts) < 3:
        return None
    return parts[2]


def upward_imports(graph: dict[str, set[str]], layers: tuple[str, ...]) -> list[str]:
    """`a -> b` for each engine import of a layer above the importer's (a module of no declared layer is one too)."""
    rank = {name: i for i, name in enumerate(layers)}
    bad = []
    for m, deps in sorted(graph.items()):
        lm = engine_layer(m)
        if lm is None:
            continue
        if lm not in rank:
            bad.append(f"{m}: in no declared layer (add it to harness.engine.LAYERS)")
            continue
        for d in sorted(deps):
            ld = engine_layer(d)
            if ld is not None and ld in rank and rank[ld] > rank[lm]:
                bad.append(f"{m} ({lm}) -> {d} ({ld})")
    return bad


def test_engine_layers_import_nothing_above_them():
    from harness.engine import LAYERS

    bad = upward_imports(GRAPH, LAYERS)
    assert not bad, "engine modules importing a layer above their own:\n  " + "\n  ".join(bad)


def test_engine_subpackages_say_their_job_and_what_they_may_import():
    from harness.engine import LAYERS

    for name in LAYERS:
        init = REPO / "harness" / "engine" / name / "__init__.py"
        if not init.exists():
            assert (REPO / "harness" / "engine" / f"{name}.py").exists(), f"layer {name}: no module or package"
            continue
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert doc and "May import" in doc, f"{init.relative_to(REPO)}: say the package's job and what it may import"


MAX_LINES = 400


def test_no_module_over_400_lines():
    files = [p for p in (REPO / "harness").rglob("*") if p.suffix in (".py", ".c", ".h")]
    long = sorted(f"{p.relative_to(REPO)}: {n}" for p in files
                  if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES)
    assert not long, f"modules over {MAX_LINES} lines (split them by concern):\n  " + "\n  ".join(long)


# ---- the checker itself, on a small package written for the purpose -----------------------------------------

@pytest.fixture
def toy(tmp_path: Path) -> Path:
    files = {
        "__init__.py": "",
        "errors.py": "",
        "a/__init__.py": "",
        "a/one.py": "from toy.a import two\n",
        "a/two.py": "def f():\n    from toy.b.three import g\n",  # a lazy import is still an edge
        "b/__init__.py": "",
        "b/three.py": "from ..errors import X\nimport toy.a.one\n",
        "b/four.py": "from . import three\n",
    }
    for name, text in files.items():
        p = tmp_path / "toy" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def test_checker_sees_lazy_and_relative_imports_and_names_the_cycle(toy: Path):
    g = import_graph(toy, "toy")
    assert g["toy.a.two"] == {"toy.b.three"}
    assert g["toy.b.three"] == {"toy.errors", "toy.a.one"}
    assert g["toy.b.four"] == {"toy.b.three"}
    assert cycles(g) == [["toy.a.one", "toy.a.two", "toy.b.three", "toy.a.one"]]
    assert cycles(package_graph(g)) == [["toy.a", "toy.b", "toy.a"]]
    del g["toy.a.two"]
    assert cycles(g) == [] and cycles(package_graph(g)) == []


def test_layer_checker_names_an_upward_import():
    g = {"harness.engine.io.reader": {"harness.engine.cache.expert_cache"},
         "harness.engine.cache.expert_cache": {"harness.engine.io.reader"},
         "harness.engine.misc.x": set(), "harness.formats.y": {"harness.engine.io.reader"}}
    bad = upward_imports(g, ("io", "cache"))
    assert bad == ["harness.engine.io.reader (io) -> harness.engine.cache.expert_cache (cache)",
                   "harness.engine.misc.x: in no declared layer (add it to harness.engine.LAYERS)"]
