"""The import structure of harness/: no cycle between files or between subpackages, harness/formats
imports nothing from harness/ but harness.errors, the engine's layers import nothing above them (the order
declared in harness/engine/__init__.py), every engine package, nested ones too, and every other package that has a
"May import" list imports only its own modules and what its list names, the harness imports from the engine only what
`harness.engine` exports (tests/helpers/import_rules.py), every engine subpackage says its job, and no module is
over 400 lines; no C module of harness/engine/native includes or calls another in a cycle (tests/helpers/
c_includes.py); and in tests/, no module imports a test module or a conftest.py (shared code lives in tests/helpers/,
shared fixtures in a conftest.py). Imports are read with `ast` from every module, those inside functions included (a
lazy import hides a cycle from Python, not from this test; tests/helpers/import_graph.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers.c_includes import c_import_graph
from tests.helpers.import_graph import cycles, explain, import_graph, package_graph, subpackage
from tests.helpers.import_rules import facade_violations, may_import_violations

REPO = Path(__file__).resolve().parents[2]

GRAPH = import_graph(REPO)


def test_no_import_cycle_between_files():
    found = cycles(GRAPH)
    assert not found, explain("files", found)


def test_no_import_cycle_between_subpackages():
    found = cycles(package_graph(GRAPH))
    assert not found, explain("subpackages", found)


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


def test_every_package_imports_only_what_its_list_names():
    from harness.engine import LAYERS

    bad = may_import_violations(REPO, LAYERS)
    assert not bad, ("an engine package's imports and its 'May import' list disagree (change the import, or the list "
                     "if the package may now import it):\n  " + "\n  ".join(bad))


# deep imports of the engine the harness may still make, each for a reason: bookkeeping's worker also runs against
# another checkout of the package (`bmoe-bench replay-cost --against`), which may be from before the facade
BEFORE_THE_FACADE = {"harness.replay.bookkeeping": {"harness.engine.cache.expert_cache.ExpertCache",
                                                    "harness.engine.cache.ExpertCache"}}


def test_the_harness_imports_only_what_the_engine_exports():
    import harness.engine

    bad = facade_violations(REPO, set(harness.engine.__all__), BEFORE_THE_FACADE)
    assert not bad, ("the harness imports from the engine only `from harness.engine import NAME`, NAME in "
                     "harness.engine.__all__ (export it there if the harness needs it):\n  " + "\n  ".join(bad))


def test_no_cycle_between_the_c_sources():
    found = cycles(c_import_graph(REPO / "harness" / "engine" / "native"))
    assert not found, explain("C modules of harness/engine/native (a source and its same-named header; one includes "
                              "or calls the other: tests/helpers/c_includes.py)", found)


MAX_LINES = 400


def test_no_module_over_400_lines():
    files = [p for p in (REPO / "harness").rglob("*") if p.suffix in (".py", ".c", ".h")]
    long = sorted(f"{p.relative_to(REPO)}: {n}" for p in files
                  if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES)
    assert not long, f"modules over {MAX_LINES} lines (split them by concern):\n  " + "\n  ".join(long)



def imports_of_test_modules(graph: dict[str, set[str]]) -> list[str]:
    """'a imports b' for each import of a test module (test_*.py) or a conftest.py: pytest loads those itself, and
    what tests share belongs in tests/helpers/ or a conftest.py fixture."""
    return [f"{m} imports {d}" for m, deps in sorted(graph.items()) for d in sorted(deps)
            if d.rpartition(".")[2].startswith("test_") or d.rpartition(".")[2] == "conftest"]


def test_no_test_module_is_imported():
    bad = imports_of_test_modules(import_graph(REPO, "tests"))
    assert not bad, "move what is shared into tests/helpers/ or a conftest.py fixture:\n  " + "\n  ".join(bad)


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


def test_test_import_checker_names_each_import_of_a_test_module_or_conftest(tmp_path: Path):
    files = {
        "a/test_one.py": "from tests.b.test_two import X\n",
        "a/test_three.py": "def t():\n    from tests.b import conftest\n",
        "a/test_ok.py": "from tests.helpers.h import Y\n",
        "b/test_two.py": "X = 1\n",
        "b/conftest.py": "",
        "helpers/h.py": "import tests.b.test_two\nY = 2\n",
    }
    for name, text in files.items():
        f = tmp_path / "tests" / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    assert imports_of_test_modules(import_graph(tmp_path, "tests")) == [
        "tests.a.test_one imports tests.b.test_two", "tests.a.test_three imports tests.b.conftest",
        "tests.helpers.h imports tests.b.test_two"]


def test_may_import_checker_reads_each_package_list_and_names_each_import_off_it(tmp_path: Path):
    files = {
        "harness/__init__.py": "",
        "harness/errors.py": "",
        "harness/kld.py": "",
        "harness/engine/__init__.py": '"""May import: harness.errors."""\n',
        "harness/engine/io/__init__.py": '"""Reads.\n\nMay import: harness.errors (its errors). Nothing else."""\n',
        "harness/engine/io/reader.py": "from harness.errors import E\nfrom . import lanes\n",
        "harness/engine/io/lanes.py": "def f():\n    import harness.kld\n",  # lazy, and not on io's list
        "harness/engine/cache/__init__.py": '"""May import: io.reader, harness.errors."""\n',
        "harness/engine/cache/budget.py": "from harness.engine.io.lanes import f\n"
                                          "from harness.engine.io import reader\n",
        "harness/engine/cache/policies/__init__.py": '"""Policies: no list."""\nfrom ..budget import x\n',
        "harness/engine/run/__init__.py": '"""May import: everything below."""\n',
        "harness/engine/stream/__init__.py": '"""May import: cache, nosuch."""\n',
        "harness/engine/native/__init__.py": '"""May import: cache (a layer above)."""\n',
        "harness/hub/__init__.py": '"""Outside the engine.\n\nMay import: harness.errors, requests."""\n',
        "harness/hub/pull.py": "import requests\nfrom harness.errors import E\nfrom harness.kld import kl\n",
        "harness/other/__init__.py": '"""No list: not checked."""\n',
        "harness/other/a.py": "import harness.kld\n",
    }
    for name, text in files.items():
        f = tmp_path / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    bad = may_import_violations(tmp_path, ("native", "io", "cache", "stream", "run"))
    assert sorted(bad) == sorted([
        "harness/engine/native/__init__.py: 'May import' names harness.engine.cache, a layer above "
        "harness.engine.native",
        "harness/engine/cache/policies/__init__.py: no 'May import:' line",
        "harness/engine/run/__init__.py: cannot read 'everything below' in 'May import: everything below' (write "
        "names separated by commas)",
        "harness/engine/stream/__init__.py: 'May import: cache, nosuch' names 'nosuch': no such module or package",
        "harness.engine.io.lanes imports harness.kld: not on harness.engine.io's 'May import' list "
        "(harness/engine/io/__init__.py)",
        "harness.engine.cache.budget imports harness.engine.io.lanes.f: not on harness.engine.cache's 'May import' "
        "list (harness/engine/cache/__init__.py)",
        "harness.hub.pull imports harness.kld.kl: not on harness.hub's 'May import' list (harness/hub/__init__.py)"])


def test_c_checker_sees_a_cycle_through_a_header_and_a_call(tmp_path: Path):
    files = {
        "a.h": "#include <stdint.h>\ntypedef struct { int n; } a_t;\nint b_go(a_t *x);  /* b.c */\n",
        "a.c": '#include "a.h"\nstatic int helper(void) { return 1; }\nint a_run(a_t *x) {\n    return b_go(x);\n}\n',
        "b.c": '#include "a.h"  /* a.h is a.c\'s: a cycle */\nint b_go(a_t *x)\n{\n    return x->n; /* a_run( */\n}\n',
        "c.c": 'void *mmap(void *p) { return p; }  /* declared nowhere here: no call edge */\n'
               'int c_main(void) { const char *s = "b_go("; return mmap(0) != 0 && s; }\n',
        "d.c": "int a_run(void *x);\nint d_main(void) { return a_run(0); }\n",  # declared in d.c itself
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    g = c_import_graph(tmp_path)
    assert g == {"a": {"b"}, "b": {"a"}, "c": set(), "d": {"a"}}
    assert cycles(g) == [["a", "b", "a"]]
    (tmp_path / "a.h").rename(tmp_path / "shared.h")  # the shared declarations under a name of their own
    for name in ("a.c", "b.c"):
        (tmp_path / name).write_text((tmp_path / name).read_text().replace('"a.h"', '"shared.h"'))
    g = c_import_graph(tmp_path)
    assert g == {"a": {"shared", "b"}, "b": {"shared"}, "c": set(), "d": {"a"}, "shared": set()}
    assert cycles(g) == []


def test_facade_checker_names_each_harness_import_past_the_facade(tmp_path: Path):
    files = {
        "harness/__init__.py": "",
        "harness/engine/__init__.py": "",
        "harness/engine/io/__init__.py": "",
        "harness/engine/io/reader.py": "from harness.engine.io import lanes\n",  # the engine itself: not checked
        "harness/probe.py": "from harness.engine import SliceReader\nfrom harness.engine.io.reader import PAGE\n",
        "harness/replay/__init__.py": "",
        "harness/replay/old.py": "def f():\n    from harness.engine.io import reader\n    import harness.engine.io\n",
        "harness/other.py": "from harness import engine\nfrom harness.engine import Secret, SliceReader\n",
    }
    for name, text in files.items():
        f = tmp_path / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    bad = facade_violations(tmp_path, {"SliceReader"}, {"harness.replay.old": {"harness.engine.io.reader"}})
    assert bad == ["harness.other imports harness.engine", "harness.other imports harness.engine.Secret",
                   "harness.probe imports harness.engine.io.reader.PAGE",
                   "harness.replay.old imports harness.engine.io"]

