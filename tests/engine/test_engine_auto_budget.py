"""--cache-mb auto: sized at load from MemAvailable and, under a memory cgroup, from its limit; capped by
--cache-ceil-mb and by the size of all experts; the value chosen is reported."""

from __future__ import annotations

import sys

import pytest

from harness.synth import ModelSpec, make_model
from tests.helpers.engine import bmoe

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("auto") / "m.gguf", ModelSpec(expert_type="f32", seed=31))[0]


def test_auto_is_capped_by_all_experts_when_memory_is_plenty(model, tmp_path):
    r = bmoe(model, "--moe-stream", "--cache-mb", "auto", n=4, tmp=tmp_path)
    assert r.rc == 0, r.stderr
    assert r.preamble["cache_mode"] == "auto"
    assert "capped at all experts" in r.preamble["cache_plan"]
    assert int(r.preamble["cache_budget_bytes"]) == int(r.preamble["expert_bytes_total"])


def test_auto_respects_the_ceiling(model, tmp_path):
    r = bmoe(model, "--moe-stream", "--cache-mb", "auto", "--cache-ceil-mb", "10", n=4, tmp=tmp_path)
    assert r.rc == 0, r.stderr
    assert int(r.preamble["cache_budget_bytes"]) == 10 * 1048576
    assert "--cache-ceil-mb 10" in r.preamble["cache_plan"]


def test_auto_reads_the_cgroup_limit(model, tmp_path):
    from harness.errors import UserError
    from harness.targets.cgroup import locate_self

    try:
        locate_self()
    except UserError as e:
        pytest.skip(f"no usable memory cgroup here: {e}")
    cap = [sys.executable, "-m", "harness.targets.capped", "--mem-mib", "400", "--"]
    r = bmoe(model, "--moe-stream", "--cache-mb", "auto", n=4, tmp=tmp_path, prefix=cap)
    assert r.rc == 0, r.stderr
    assert "cgroup limit 400 MiB" in r.preamble["cache_plan"]
    assert int(r.preamble["cache_budget_bytes"]) < 400 * 1048576
