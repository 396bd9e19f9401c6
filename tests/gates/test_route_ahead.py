"""`--route-ahead N` gates on generated models (qwen3moe: softmax; minimax-m2: sigmoid with exp_probs_b).

The knob is lossy, so the gates are: streamed == resident at the same N (cache off, a cache with evictions on
2 lanes, buffered reads; O_DIRECT is the default elsewhere), N = 0 == off byte for byte, and N >= 1 changes the
output (its slot agreement with the true routing is below 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.engine.config import parse_cli
from harness.errors import UserError
from harness.synth import make_model
from harness.synth.shapes import shape_spec
from tests.helpers.engine import bmoe

N_TOK = 16
ARCHS = ("qwen3moe", "minimax-m2")


def test_route_ahead_refuses_what_routes_otherwise() -> None:
    for extra in (["--route-replay", "t.csv"], ["--moe-stream", "--route-trace", "t.csv"],
                  ["--moe-stream", "--drop-cold-experts", "0.5"], ["--drop-replay", "t.csv"]):
        with pytest.raises(UserError, match="--route-ahead .* cannot be combined"):
            parse_cli(["-m", "m.gguf", "--route-ahead", "1", *extra])
    assert parse_cli(["-m", "m.gguf", "--route-ahead", "2"]).route_ahead == 2  # resident: no --moe-stream needed
    with pytest.raises(UserError, match="--route-ahead must be >= 0"):
        parse_cli(["-m", "m.gguf", "--route-ahead", "-1"])


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("ra")
    return {a: make_model(d / f"{a}.gguf", shape_spec("tiny", arch=a, seed=50 + i))[0] for i, a in enumerate(ARCHS)}


@pytest.fixture(scope="module")
def resident(models, tmp_path_factory):
    d = tmp_path_factory.mktemp("ra-res")
    got: dict[tuple[str, tuple[str, ...]], object] = {}

    def get(arch: str, *flags: str):
        if (arch, flags) not in got:
            r = bmoe(models[arch], *flags, n=N_TOK, tmp=d)
            assert r.rc == 0, r.stderr
            assert len(r.tokens) == N_TOK
            got[(arch, flags)] = r
        return got[(arch, flags)]

    return get


# cache off (shared slots: reads at the layer's own routing node); a 1 MiB cache (evictions; reads at commit time)
# on 2 lanes with O_DIRECT; the same with buffered reads
STREAMED = [("--cache-mb", "0"), ("--cache-mb", "1", "--io-threads", "2"), ("--cache-mb", "1", "--no-odirect"),
            ("--cache-mb", "1", "--recycle-pages", "move")]  # and evicted pages recycled (held ones released late)


@pytest.mark.engine
@pytest.mark.parametrize("flags", STREAMED, ids=["cache-off", "evictions-2-lanes", "evictions-buffered",
                                                  "evictions-recycled"])
@pytest.mark.parametrize("arch", ARCHS)
def test_streamed_matches_resident_at_the_same_n(models, resident, tmp_path, arch, flags):
    n = "2"
    ref = resident(arch, "--route-ahead", n)
    r = bmoe(models[arch], "--moe-stream", *flags, "--route-ahead", n, n=N_TOK, tmp=tmp_path)
    assert r.rc == 0, r.stderr
    assert r.tokens == ref.tokens
    assert r.summary["route_agree"] == ref.summary["route_agree"]  # the same committed and true routing
    cached = flags[1] != "0"
    assert r.summary["route_ahead_early_reads"] == int(cached)
    if cached:
        assert r.summary["evictions"] > 0
        assert r.preamble["odirect_effective"] == ("0" if "--no-odirect" in flags else "1")
    if "--recycle-pages" in flags:
        assert r.summary["pool_recycled"] > 0 and r.summary["pool_errors"] == 0, r.summary


@pytest.mark.engine
@pytest.mark.parametrize("arch", ["minimax-m2"])  # qwen3moe's evictions are covered at N = 2
def test_route_ahead_one_with_evictions_matches_resident(models, resident, tmp_path, arch):
    ref = resident(arch, "--route-ahead", "1")
    r = bmoe(models[arch], "--moe-stream", "--cache-mb", "1", "--route-ahead", "1", n=N_TOK, tmp=tmp_path)
    assert r.rc == 0, r.stderr
    assert r.tokens == ref.tokens and r.summary["evictions"] > 0


@pytest.mark.engine
@pytest.mark.parametrize("arch", ARCHS)
def test_route_ahead_zero_is_off_byte_for_byte(models, resident, tmp_path, arch):
    off, zero = resident(arch), resident(arch, "--route-ahead", "0")
    assert zero.stdout == off.stdout and zero.tokens == off.tokens
    if arch != ARCHS[0]:
        return  # streamed: one architecture is enough (the knob builds nothing at 0)
    s_off = bmoe(models[arch], "--moe-stream", "--cache-mb", "1", n=N_TOK, tmp=tmp_path)
    s_zero = bmoe(models[arch], "--moe-stream", "--cache-mb", "1", "--route-ahead", "0", n=N_TOK, tmp=tmp_path)
    assert s_zero.stdout == s_off.stdout and s_zero.tokens == s_off.tokens == off.tokens
    assert s_zero.summary["hit_pct"] == s_off.summary["hit_pct"]  # the same cache decisions
    assert "route_agree" not in s_zero.summary and "lossy" not in s_zero.preamble


@pytest.mark.engine
@pytest.mark.parametrize("arch", ARCHS)
def test_route_ahead_is_lossy_and_reports_its_agreement(models, resident, tmp_path, arch):
    from harness.formats.metrics_csv import read_metrics

    off = resident(arch)
    for n in ("1", "2"):
        r = resident(arch, "--route-ahead", n)
        assert r.tokens != off.tokens  # it changes the routing, hence the output
        assert 0 < r.summary["route_agree"] < 1
        assert "--route-ahead" in r.preamble["lossy"]
    r = bmoe(models[arch], "--route-ahead", "1", n=8, tmp=tmp_path)
    col = read_metrics(tmp_path / "run-0.csv").col("route_agree")
    assert r.rc == 0 and col is not None and len(col) == 8
    assert ((col >= 0) & (col <= 1)).all()  # every decode token routes some layer ahead: no -1


@pytest.mark.engine
def test_route_ahead_refuses_an_arch_it_does_not_model(tmp_path):
    (path,) = make_model(tmp_path / "l4.gguf", shape_spec("tiny", arch="llama4", seed=3))
    r = bmoe(path, "--route-ahead", "1", n=2, tmp=tmp_path)
    assert r.rc == 2 and "--route-ahead" in r.stderr and "llama4" in r.stderr and "Traceback" not in r.stderr
