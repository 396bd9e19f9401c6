"""The streamed run the byte-identity gates compare (test_engine_gates.py and the architectures' gate files): N greedy
tokens of `bmoe --moe-stream` on one of the module's models; the resident reference is tests/gates/conftest.py's
`resident` fixture."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.engine import Run, bmoe

N = 24  # tokens per run


def stream(models: dict[str, Path], tmp_path: Path, name: str, *flags: str, env: dict[str, str] | None = None) -> Run:
    r = bmoe(models[name], "--moe-stream", *flags, n=N, tmp=tmp_path, env=env)
    assert r.rc == 0, r.stderr
    return r
