"""What a streamed bmoe run imports before its first token leaves out the packages it does not use (pandas: the
metrics CSV is only written; pydantic: replies of --prompts-file only), measured in a fresh interpreter by
harness.memcap.imports (bench-data/2026-12-03-mincap: each one is memory a capped engine holds for nothing); and the
engine's facade (harness/engine/__init__.py) loads nothing until a name of it is asked for, each from its home."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine


def test_the_engine_path_does_not_import_what_it_does_not_use():
    out = subprocess.run([sys.executable, "-m", "harness.memcap.imports", "--engine"], capture_output=True, text=True,
                         check=True)
    rows = [json.loads(s) for s in out.stdout.splitlines()]
    assert [r["step"] for r in rows][-2] == "alone:llama_cpp.llama_cpp"
    loaded = rows[-1]["third_party"]
    assert "llama_cpp" in loaded and "numpy" in loaded  # what it does use is there
    for unused in ("pandas", "pydantic", "rich", "typer", "scipy", "matplotlib", "yaml", "jinja2", "diskcache"):
        assert unused not in loaded, f"a streamed run imports {unused}: {loaded}"
    assert rows[-1]["anon_mib"] > 0 and all(r["modules"] >= 0 for r in rows)


def test_a_package_imported_in_part_still_works_whole_later():
    code = """
import sys
from harness.formats.partial_import import submodule_alone
c = submodule_alone("gguf.constants")
L = submodule_alone("llama_cpp.llama_cpp")
assert "gguf.gguf_writer" not in sys.modules and "llama_cpp.llama" not in sys.modules, sorted(sys.modules)
assert c.GGMLQuantizationType.Q4_K == 12 and L.llama_print_system_info()
import gguf
from llama_cpp import Llama
import llama_cpp
assert gguf.GGUFWriter and gguf.constants is c and Llama is llama_cpp.llama.Llama and llama_cpp.__version__
assert llama_cpp.llama_cpp is L and "gguf.gguf_writer" in sys.modules
try:
    gguf.no_such_name
except AttributeError as e:
    assert "no_such_name" in str(e)
else:
    raise AssertionError("a missing name must still be an AttributeError")
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == "ok\n", out.stderr


def test_importing_the_facade_loads_no_engine_module_and_no_third_party_package():
    code = ("import sys, harness.engine\n"
            "print(sorted(m for m in sys.modules if m.startswith('harness') or m.split('.')[0] in "
            "('numpy', 'llama_cpp', 'pandas', 'pydantic', 'gguf', 'jinja2', 'yaml')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['harness', 'harness.engine']"


def test_every_name_the_facade_exports_is_its_home_s():
    import harness.engine as facade

    assert sorted(facade.__all__) == sorted(facade._EXPORTS)
    tree = ast.parse(Path(facade.__file__).read_text(encoding="utf-8"))
    typing_homes = {a.asname or a.name: node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and node.module and node.module.startswith("harness.engine.") for a in node.names}
    assert typing_homes == facade._EXPORTS  # the TYPE_CHECKING imports say the same homes
    for name, home in facade._EXPORTS.items():
        assert getattr(facade, name) is getattr(importlib.import_module(home), name)
    with pytest.raises(AttributeError, match="no_such_name"):
        facade.no_such_name  # noqa: B018
    with pytest.raises(ImportError):
        from harness.engine import ExpertCachee  # noqa: F401

