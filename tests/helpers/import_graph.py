"""The import graph of a package read with `ast` from every module, imports inside functions included (a lazy import
hides a cycle from Python, not from this reader), and its cycles: what tests/engine/test_structure.py checks."""

from __future__ import annotations

import ast
from pathlib import Path


def modules(root: Path, package: str = "harness") -> dict[str, Path]:
    """Dotted module name -> file, for every .py under root/package (a package is its __init__.py)."""
    out = {}
    for p in sorted((root / package).rglob("*.py")):
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def imported(node: ast.AST, module: str, is_pkg: bool) -> list[str]:
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
            names = imported(node, m, path.name == "__init__.py")
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


def explain(kind: str, found: list[list[str]]) -> str:
    """One line per tangle: a cycle through it (break every cycle among those modules, not just this one)."""
    return f"import cycles between {kind}:\n" + "\n".join("  " + " -> ".join(c) for c in found)
