"""What the gate modules share: `resident`, the reference token streams of the plain mmap run (no hook), over the
requesting module's own `models` fixture (name -> model path). A module with another reference (other token count,
other check) defines its own `resident`, which pytest prefers to this one."""

from __future__ import annotations

import pytest

from tests.helpers.engine import bmoe
from tests.helpers.gates import N


@pytest.fixture(scope="module")
def resident(models, tmp_path_factory):
    """Reference token streams from the plain mmap run (no hook), computed once per model."""
    d = tmp_path_factory.mktemp("resident")
    cache: dict[tuple[str, tuple[str, ...]], list[int]] = {}

    def get(name: str, *flags: str) -> list[int]:
        key = (name, flags)
        if key not in cache:
            r = bmoe(models[name], *flags, n=N, tmp=d)
            assert r.rc == 0, r.stderr
            assert len(r.tokens) == N, "the reference run stopped early; the gate needs a full stream"
            assert len(set(r.tokens)) > N // 3, f"degenerate reference output {r.tokens}"
            cache[key] = r.tokens
        return cache[key]

    return get
