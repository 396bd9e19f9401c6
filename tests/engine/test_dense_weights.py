"""`--dense-weights mmap|warm|anon|auto`: the pure parts (ranges, pages, sampling, mincore, the anonymous copies'
bytes, the warm sweep) without llama.cpp; then the engine's gates on qwen3moe and gpt-oss tiny models: streamed
== resident token for token in every mode, cache off and with evictions; anon without --moe-stream; the pure-Python
callback front; and the controls: one wrong expert still diverges in every mode, and a zeroed anonymous copy
diverges (the graph really reads the copies, not llama.cpp's file mapping)."""

from __future__ import annotations

import ctypes
import dataclasses
import mmap
from pathlib import Path

import pytest

from harness.engine.config import parse_cli
from harness.engine.io.dense import (
    AnonDense,
    _Mincore,
    effective_mode,
    mapping_spans,
    merged_ranges,
    page_ranges,
    sample_every,
    warm_sweep,
)
from harness.engine.io.vm import PAGE, Reservation
from harness.engine.model.gguf_layout import DenseTensor, load_layout
from harness.errors import UserError
from harness.formats.route_trace import DECODE, read_route_trace
from harness.synth import ModelSpec, make_model
from harness.synth.shapes import shape_spec
from tests.helpers.engine import bmoe

N = 24


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("dense")
    return {
        "q4_k": make_model(d / "q4_k.gguf", ModelSpec(expert_type="q4_k", seed=1))[0],
        "gpt-oss": make_model(d / "gpt-oss.gguf", dataclasses.replace(shape_spec("tiny", arch="gpt-oss"), n_swa=16,
                                                                        seed=21))[0],
    }


# -- pure parts -----------------------------------------------------------------------------------------------


def _t(name: str, off: int, n: int, path: str = "m.gguf") -> DenseTensor:
    return DenseTensor(name, Path(path), off, n, (n,), 0)


def test_ranges_merge_in_file_order_and_pages_cover_them() -> None:
    ts = [_t("c", 5000, 100), _t("a", 0, 64), _t("b", 64, 36), _t("d", 20000, 10), _t("e", 0, 8, "n.gguf")]
    got = merged_ranges(ts)
    assert got[Path("m.gguf")] == [(0, 100), (5000, 5100), (20000, 20010)]
    assert got[Path("n.gguf")] == [(0, 8)]
    # 0..100 and 5000..5100 share page 0 and page 1 is 4096..8192: one span; 20000 is on page 4
    assert page_ranges(got[Path("m.gguf")]) == [(0, 2 * PAGE), (4 * PAGE, 5 * PAGE)]


def test_auto_is_anon_streamed_and_mmap_plain_and_the_flag_is_checked() -> None:
    assert effective_mode("auto", True) == "anon" and effective_mode("auto", False) == "mmap"
    assert effective_mode("warm", True) == "warm"
    assert parse_cli(["-m", "x.gguf"]).dense_weights == "auto"
    assert parse_cli(["-m", "x.gguf", "--dense-weights", "anon"]).dense_weights == "anon"  # no --moe-stream needed
    with pytest.raises(UserError, match="--dense-weights"):
        parse_cli(["-m", "x.gguf", "--dense-weights", "ram"])


def test_mincore_counts_the_touched_pages_of_a_reservation() -> None:
    r = Reservation(8 * PAGE, 0)
    span = [(r.base + PAGE, 8 * PAGE)]  # data sits one page in (file offset 0)
    assert _Mincore(span).frac() == 0.0  # MAP_NORESERVE: nothing resident until touched
    for i in range(0, 8, 2):
        ctypes.memset(r.data + i * PAGE, 1, 1)
    assert _Mincore(span).frac() == 0.5


def test_sample_every_grows_with_the_dense_bytes(models) -> None:
    lay = load_layout(models["q4_k"])
    assert sample_every(lay) == 1  # 4 MB of dense weights: every token
    lay.nonexpert_bytes = 150 << 20
    assert sample_every(lay) == 4


@pytest.mark.parametrize("odirect", [True, False])
def test_anon_copies_hold_the_files_bytes(models, odirect: bool) -> None:
    lay = load_layout(models["gpt-oss"])
    anon = AnonDense(lay, odirect=odirect, lanes=2)
    anon.load()
    assert anon.reader.odirect == odirect
    assert anon.read_bytes >= lay.nonexpert_bytes
    with open(models["gpt-oss"], "rb") as f:
        for name, t in lay.dense.items():
            f.seek(t.abs_offset)
            assert ctypes.string_at(anon.copies[name].res.data, t.nbytes) == f.read(t.nbytes), name
    anon.finish()
    assert anon.freed == len(lay.dense)  # none bound: all freed


def test_warm_sweep_reads_every_dense_byte_once_and_mapping_spans_see_them(models) -> None:
    lay = load_layout(models["q4_k"])
    got, _s = warm_sweep(lay)
    assert got == lay.nonexpert_bytes  # tensors never overlap
    with open(models["q4_k"], "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        spans = mapping_spans(lay)
        want = sum(b - a for rs in merged_ranges(lay.dense.values()).values() for a, b in page_ranges(rs))
        assert sum(n for _, n in spans) == want
        assert _Mincore(spans).frac() == 1.0  # just swept into the page cache (ext4 or tmpfs alike)
        m.close()


# -- the engine's gates -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def resident(models, tmp_path_factory):
    """The plain run, dense weights in llama.cpp's mapping (no hook): the reference."""
    d = tmp_path_factory.mktemp("dense-resident")
    out = {}
    for name, path in models.items():
        r = bmoe(path, "--dense-weights", "mmap", n=N, tmp=d)
        assert r.rc == 0, r.stderr
        assert len(r.tokens) == N and len(set(r.tokens)) > N // 3, r.tokens
        assert "hook_front" not in r.preamble
        out[name] = r.tokens
    return out


def _run(models, tmp_path, name, *flags, env=None):
    r = bmoe(models[name], *flags, n=N, tmp=tmp_path, env=env)
    assert r.rc == 0, r.stderr
    return r


def _fracs(tmp_path: Path) -> list[float]:
    from harness.formats.metrics_csv import read_metrics

    csv = sorted(tmp_path.glob("run-*.csv"), key=lambda p: p.stat().st_mtime)[-1]
    col = read_metrics(csv).col("dense_resident_frac")
    return [float(x) for x in col if x == x]  # NaN = -1 = not sampled


@pytest.mark.engine
@pytest.mark.parametrize("cache", ["0", "1"])
@pytest.mark.parametrize("mode", ["mmap", "warm", "anon"])
@pytest.mark.parametrize("name", ["q4_k", "gpt-oss"])
def test_streamed_matches_resident_in_every_dense_mode(models, resident, tmp_path, name, mode, cache):
    r = _run(models, tmp_path, name, "--moe-stream", "--cache-mb", cache, "--dense-weights", mode)
    assert r.tokens == resident[name]
    assert r.preamble["dense_weights"] == mode
    if cache == "1":
        assert r.summary["evictions"] > 0, "the cache was meant to evict"
    fr = _fracs(tmp_path)
    assert len(fr) == N  # tiny dense weights: measured every token
    if mode == "anon":
        assert fr == [1.0] * N
        assert r.summary["dense_bound_tensors"] == len(load_layout(models[name]).dense)  # the graph reads them all
        assert r.summary["dense_unused_tensors"] == 0
    else:
        assert all(0.0 <= x <= 1.0 for x in fr)


@pytest.mark.engine
@pytest.mark.parametrize("mode", ["warm", "anon"])
@pytest.mark.parametrize("name", ["q4_k", "gpt-oss"])
def test_plain_run_matches_in_warm_and_anon(models, resident, tmp_path, name, mode):
    """anon works without --moe-stream: the hook is installed only to rebind the dense weights."""
    r = _run(models, tmp_path, name, "--dense-weights", mode)
    assert r.tokens == resident[name]
    assert ("hook_front" in r.preamble) == (mode == "anon")


@pytest.mark.engine
def test_default_is_anon_streamed_and_mmap_plain(models, resident, tmp_path):
    s = _run(models, tmp_path, "q4_k", "--moe-stream", "--cache-mb", "1")
    p = _run(models, tmp_path, "q4_k")
    assert (s.preamble["cfg.dense_weights"], s.preamble["dense_weights"]) == ("auto", "anon")
    assert (p.preamble["dense_weights"], "hook_front" in p.preamble) == ("mmap", False)
    assert s.tokens == p.tokens == resident["q4_k"]


@pytest.mark.engine
def test_pure_python_front_rebinds_too(models, resident, tmp_path):
    r = _run(models, tmp_path, "q4_k", "--moe-stream", "--cache-mb", "1", "--dense-weights", "anon",
             env={"BMOE_HOOK": "python"})
    assert r.preamble["hook_front"] == "python"
    assert r.summary["dense_bound_tensors"] == len(load_layout(models["q4_k"]).dense)
    assert r.tokens == resident["q4_k"]


@pytest.mark.engine
@pytest.mark.parametrize("mode", ["mmap", "warm", "anon"])
@pytest.mark.parametrize("name", ["q4_k", "gpt-oss"])
def test_negative_control_wrong_expert_diverges_in_every_mode(models, resident, tmp_path, name, mode):
    trace = tmp_path / "t.route.csv"
    _run(models, tmp_path, name, "--moe-stream", "--cache-mb", "0", "--route-trace", str(trace))
    tr = read_route_trace(trace)
    expert = next(r.expert for r in tr.rows if r.phase == DECODE and r.layer == 1)
    env = {"BMOE_TEST_WRONG_EXPERT": f"1,{expert},{(expert + 1) % tr.header.n_expert}"}
    r = _run(models, tmp_path, name, "--moe-stream", "--cache-mb", "0", "--dense-weights", mode, env=env)
    assert r.tokens != resident[name]


@pytest.mark.engine
@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("name,tensor", [("q4_k", "output_norm.weight"), ("q4_k", "blk.2.attn_q.weight"),
                                         ("gpt-oss", "token_embd.weight"), ("gpt-oss", "blk.1.attn_sinks.weight")])
def test_zeroed_anonymous_copy_diverges(models, resident, tmp_path, name, tensor, stream):
    """If the graph still read llama.cpp's mapping, zeroing the anonymous copy would change nothing."""
    flags = ("--moe-stream", "--cache-mb", "1") if stream else ()
    r = _run(models, tmp_path, name, *flags, "--dense-weights", "anon", env={"BMOE_TEST_ZERO_DENSE": tensor})
    assert r.tokens != resident[name]
