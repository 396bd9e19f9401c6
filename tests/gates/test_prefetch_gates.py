"""Byte-identity gates for prefetch (lossless): streamed with speculative reads == the resident run, token for
token, on generated models; and one wrong expert still diverges with prefetch on."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from harness.formats.metrics_csv import read_metrics
from harness.formats.route_trace import DECODE, read_route_trace
from harness.synth import ModelSpec, make_model
from tests.helpers.engine import bmoe

pytestmark = pytest.mark.engine

N = 24
SMALL = "1"  # MiB: holds 9 of the tiny Q4_K model's 32 experts (T = 0.84 MiB): evicts, and prefetch has work


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("pfmodel") / "q4_k.gguf", ModelSpec(expert_type="q4_k", seed=1))[0]


@pytest.fixture(scope="module")
def resident(model, tmp_path_factory) -> list[int]:
    r = bmoe(model, n=N, tmp=tmp_path_factory.mktemp("pfres"))
    assert r.rc == 0, r.stderr
    assert len(r.tokens) == N and len(set(r.tokens)) > N // 3
    return r.tokens


def _stream(model, tmp_path, *flags, env=None):
    r = bmoe(model, "--moe-stream", *flags, n=N, tmp=tmp_path, env=env)
    assert r.rc == 0, r.stderr
    return r


@pytest.mark.parametrize("flags", [
    ("--prefetch", "1"),  # O_DIRECT, 4 lanes, the default policy (aged-markov)
    ("--prefetch", "2", "--no-odirect"),
    ("--prefetch", "2", "--io-threads", "2"),
    ("--prefetch", "3", "--io-threads", "1", "--cache-policy", "lru"),  # one lane: reads mostly withdrawn
    ("--prefetch", "1", "--cache-policy", "lfu", "--prefetch-lanes", "4"),  # admissions refused by the policy
    ("--predict-prefetch",),
    ("--predict-prefetch", "--predict-spec-max", "1", "--no-odirect"),
    ("--predict-prefetch", "--prefetch", "2", "--io-threads", "2"),
    ("--prefetch", "2", "--recycle-pages", "move"),  # evicted pages to the next read, demand or speculative
    ("--predict-prefetch", "--recycle-pages", "memfd", "--no-odirect", "--io-threads", "3"),
])
def test_prefetch_streamed_matches_resident(model, resident, tmp_path, flags):
    r = _stream(model, tmp_path, "--cache-mb", SMALL, *flags)
    assert r.tokens == resident
    assert r.summary["evictions"] > 0 and r.summary["prefetch_mib"] > 0, r.summary
    assert r.preamble["odirect_effective"] == ("0" if "--no-odirect" in flags else "1")
    if "--predict-prefetch" in flags:
        assert 0 < r.summary["predict_agree"] < 1  # the next layer's router on this layer's input: a guess
    if "--recycle-pages" in flags:
        assert r.summary["pool_recycled"] > 0 and r.summary["pool_errors"] == 0, r.summary


def test_prefetch_counts_add_up(model, tmp_path):
    r = _stream(model, tmp_path, "--cache-mb", SMALL, "--prefetch", "2")
    m = read_metrics(r.csv)
    mib = 1048576
    s = r.summary
    assert s["prefetch_used_mib"] > 0, s
    assert s["prefetch_mib"] == pytest.approx(m.col("prefetch_bytes").sum() / mib, abs=1e-3)
    assert s["prefetch_used_mib"] == pytest.approx(m.col("prefetch_used_bytes").sum() / mib, abs=1e-3)
    # every prefetched expert is used, evicted unused, or still resident unused at the end (reads still in
    # flight after the last token are not counted as prefetched yet)
    assert s["prefetch_used_mib"] + s["prefetch_wasted_mib"] >= s["prefetch_mib"] - 1e-3
    assert (m.col("read_bytes") >= m.col("prefetch_bytes")).all()


def test_without_prefetch_the_columns_are_unmeasured(model, tmp_path):
    r = _stream(model, tmp_path, "--cache-mb", SMALL)
    m = read_metrics(r.csv)
    assert m.col("prefetch_bytes") is not None and all(v != v for v in m.col("prefetch_bytes"))  # NaN: -1
    assert "prefetch_mib" not in r.summary


def test_prefetch_needs_a_cache(model, tmp_path):
    r = bmoe(model, "--moe-stream", "--cache-mb", "0", "--prefetch", "1", n=2, tmp=tmp_path)
    assert r.rc == 2 and "--prefetch reads experts ahead into the expert cache" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("mode", [("--prefetch", "2"), ("--predict-prefetch",),
                                  ("--prefetch", "2", "--recycle-pages", "move")])
def test_one_wrong_expert_still_diverges_with_prefetch_on(model, resident, tmp_path, mode):
    """Every read of one expert (demand or speculative) gets another expert's bytes: the gate must see it.
    Buffered reads: with O_DIRECT a neighbour's page-aligned read, which prefetch may run while the layer
    computes, writes the file's true bytes over the boundary page it shares with the wrong slice, so how
    wrong the slice is would vary from run to run."""
    trace = tmp_path / "t.route.csv"
    flags = ("--cache-mb", SMALL, *mode, "--no-odirect")
    _stream(model, tmp_path, *flags, "--route-trace", str(trace))
    rows = [r for r in read_route_trace(trace).rows if r.phase == DECODE and r.layer == 2]
    expert = Counter(r.expert for r in rows).most_common(1)[0][0]
    env = {"BMOE_TEST_WRONG_EXPERT": f"2,{expert},{(expert + 1) % 8}"}
    r = _stream(model, tmp_path, *flags, env=env)
    assert r.summary["prefetch_mib"] > 0
    assert r.tokens != resident
