"""What a streamed bmoe run imports before its first token leaves out the packages it does not use (pandas: the
metrics CSV is only written; pydantic: replies of --prompts-file only), measured in a fresh interpreter by
harness.memcap.imports (bench-data/2026-12-03-mincap: each one is memory a capped engine holds for nothing)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.engine


def test_the_engine_path_does_not_import_what_it_does_not_use():
    out = subprocess.run([sys.executable, "-m", "harness.memcap.imports", "--engine"], capture_output=True, text=True,
                         check=True)
    rows = [json.loads(s) for s in out.stdout.splitlines()]
    assert [r["step"] for r in rows][-2] == "llama_cpp.llama_cpp"
    loaded = rows[-1]["third_party"]
    assert "llama_cpp" in loaded and "numpy" in loaded  # what it does use is there
    for unused in ("pandas", "pydantic", "rich", "typer", "scipy", "matplotlib"):
        assert unused not in loaded, f"a streamed run imports {unused}: {loaded}"
    assert rows[-1]["anon_mib"] > 0 and all(r["modules"] >= 0 for r in rows)
