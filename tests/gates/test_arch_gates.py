"""The byte-identity gates over architectures: for each, a tiny synthetic model (exactly the tensors its llama.cpp
loader creates: an extra or missing one fails the load) streams token for token as it runs resident, with the
cache off, with a cache small enough to evict on two reader lanes, O_DIRECT on in both; and one wrong expert
loaded in one layer makes the output diverge, so the gate can fail for that architecture.

A new architecture is one entry in ARCH_SPECS (tests/helpers/arch_specs.py: its spec, with a seed whose resident
output is not degenerate on x86-64 and on arm64)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.formats.route_trace import DECODE, read_route_trace
from harness.synth import make_model
from tests.helpers.arch_specs import ARCH_SPECS, N, degenerate
from tests.helpers.engine import Run, bmoe

pytestmark = pytest.mark.engine

NAMES = list(ARCH_SPECS)


def _stream(models: dict[str, Path], tmp: Path, name: str, *flags: str, env: dict[str, str] | None = None) -> Run:
    r = bmoe(models[name], "--moe-stream", *flags, n=N, tmp=tmp, env=env)
    assert r.rc == 0, r.stderr
    return r


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("archs")
    return {name: make_model(d / f"{name}.gguf", spec)[0] for name, spec in ARCH_SPECS.items()}


@pytest.fixture(scope="module")
def resident(models, tmp_path_factory):
    """Each model's reference tokens from the plain mmap run (no hook), computed once."""
    d = tmp_path_factory.mktemp("resident")
    cache: dict[str, list[int]] = {}

    def get(name: str) -> list[int]:
        if name not in cache:
            r = bmoe(models[name], n=N, tmp=d)
            assert r.rc == 0, r.stderr
            assert len(r.tokens) == N, "the reference run stopped early; the gate needs a full stream"
            assert not degenerate(r.tokens), \
                f"degenerate reference output {r.tokens}: pick another seed (python -m tests.helpers.arch_seeds)"
            cache[name] = r.tokens
        return cache[name]

    return get


@pytest.fixture(scope="module")
def traced(models, tmp_path_factory):
    """The cache-off streamed run of each model, with its route trace (the wrong-expert control picks from it)."""
    d = tmp_path_factory.mktemp("traced")
    runs: dict[str, tuple] = {}

    def get(name: str):
        if name not in runs:
            trace = d / f"{name}.route.csv"
            runs[name] = (_stream(models, d, name, "--cache-mb", "0", "--route-trace", str(trace)), trace)
        return runs[name]

    return get


@pytest.mark.parametrize("name", NAMES)
def test_cache_off_matches_resident(traced, resident, name):
    r, _ = traced(name)
    assert r.tokens == resident(name)
    assert r.preamble["odirect_effective"] == "1"
    assert r.summary["hit_pct"] == -1 and r.summary["mib_read_per_token"] > 0


@pytest.mark.parametrize("name", NAMES)
def test_evicting_cache_on_two_lanes_matches_resident(models, resident, tmp_path, name):
    r = _stream(models, tmp_path, name, "--cache-mb", "1", "--io-threads", "2")
    assert r.tokens == resident(name)
    assert r.preamble["odirect_effective"] == "1"
    assert r.summary["evictions"] > 0, "the cache was meant to evict"


@pytest.mark.parametrize("name", NAMES)
def test_one_wrong_expert_diverges(models, traced, resident, tmp_path, name):
    """Expert e's slot in the first MoE layer filled with another expert's bytes: the gate must see it. (The first
    layer: on glm4moe's generated model a swap in the last layer moved no argmax once llama.cpp was built without
    llamafile's sgemm; an error in the first layer passes through every later one.)"""
    _, trace = traced(name)
    rows = read_route_trace(trace).rows
    layer = min(r.layer for r in rows)
    expert = next(r.expert for r in rows if r.phase == DECODE and r.layer == layer)  # used in decode
    n_expert = ARCH_SPECS[name].n_expert
    r = _stream(models, tmp_path, name, "--cache-mb", "0",
                env={"BMOE_TEST_WRONG_EXPERT": f"{layer},{expert},{(expert + 1) % n_expert}"})
    assert r.tokens != resident(name)
