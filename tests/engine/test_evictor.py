"""The evictor thread (harness.engine.cache.evictor): decode evictions decided off the compute thread, the same
decisions as on it (--no-evict-thread)."""

from __future__ import annotations

import threading

import pytest

from harness.engine.cache.evictor import Evictor
from harness.formats.metrics_csv import read_metrics
from harness.synth import ModelSpec, make_model
from tests.helpers.engine import bmoe

N = 24


def test_runs_jobs_on_its_own_thread_one_at_a_time():
    ev = Evictor()
    seen: list[int] = []
    try:
        for i in range(50):
            ev.submit(lambda i=i: seen.append(threading.get_ident()) or None)
            assert ev.pending
            assert ev.join() >= 0
            assert not ev.pending
        assert len(seen) == 50 and threading.get_ident() not in seen
        with pytest.raises(RuntimeError, match="still pending"):
            ev.submit(lambda: None)
            ev.submit(lambda: None)
    finally:
        ev.close()
    assert not ev._thread.is_alive()


def test_a_job_error_is_raised_at_join_and_the_thread_goes_on():
    ev = Evictor()
    try:
        ev.submit(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            ev.join()
        out = []
        ev.submit(lambda: out.append(1))
        ev.join()
        assert out == [1]
    finally:
        ev.close()


def test_join_without_a_job_and_close_twice():
    ev = Evictor()
    assert ev.join() == 0
    ev.close()
    ev.close()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("ev") / "m.gguf", ModelSpec(expert_type="q4_k", seed=11))[0]


@pytest.mark.engine
@pytest.mark.parametrize("policy", ["lru", "markov-duel"])
def test_same_tokens_reads_and_hits_with_and_without_the_evictor(model, tmp_path, policy):
    """Every decision the same: per token, the same token id, bytes read and hit rate; the evictor's CPU is
    measured where it ran and is 0 with --no-evict-thread; both equal the resident run."""
    ref = bmoe(model, n=N, tmp=tmp_path / "res")
    assert ref.rc == 0, ref.stderr
    runs = {}
    for name, flags in {"on": (), "off": ("--no-evict-thread",)}.items():
        r = bmoe(model, "--moe-stream", "--cache-mb", "1", "--cache-policy", policy, *flags, n=N,
                 tmp=tmp_path / name)
        assert r.rc == 0, r.stderr
        assert r.summary["evictions"] > 0, "the cache was meant to evict"
        assert r.tokens == ref.tokens
        runs[name] = read_metrics(r.csv).rows
    on, off = runs["on"], runs["off"]
    for col in ("token_id", "read_bytes", "cache_hit_pct"):
        assert on[col].tolist() == off[col].tolist(), col
    decode = on.iloc[1:]  # the prompt's batch decides on the compute thread
    assert (decode.mgmt_bg_cpu_ms > 0).all(), decode.mgmt_bg_cpu_ms
    assert (off.mgmt_bg_cpu_ms == 0).all()
