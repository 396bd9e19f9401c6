"""qwen35moe, qwen3next, lfm2moe, minimax-m2 and llama4: their synthetic files (exactly what llama.cpp's loader
creates: an extra or a missing tensor fails the load), the layout facts read from them (MTP blocks outside the
trunk, leading and interleaved dense layers, shared experts and exp_probs_b resident), and the gates: streamed
output equals resident output with the cache off, with evictions, with 2 reader lanes and without O_DIRECT."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.constants import GGMLQuantizationType as QT
from gguf.quants import dequantize

from harness.bench_cli import main as bench_main
from harness.engine.model.gguf_layout import load_layout
from harness.engine.model.registry import COVERED, REGISTRY
from harness.formats.route_trace import DECODE, read_route_trace
from harness.synth import expert_locations, make_model, plan_model
from harness.synth.archs import _parts as P
from harness.synth.fill import tensor_chunks
from harness.synth.shapes import shape_spec
from tests.gates.test_engine_gates import _stream, resident  # noqa: F401  (resident: its fixture, over this module's `models`)

ARCHS = ("qwen35moe", "qwen3next", "lfm2moe", "minimax-m2", "llama4")
# the tiny models' routed layers: qwen3.5/next 4 trunk layers (+ an MTP block, blk.4), lfm2moe 2 leading dense
# blocks of 6, llama4 MoE in every other layer
MOE_LAYERS = {"qwen35moe": [0, 1, 2, 3], "qwen3next": [0, 1, 2, 3], "lfm2moe": [2, 3, 4, 5],
              "minimax-m2": [0, 1, 2, 3], "llama4": [1, 3]}


def _fields(path: Path) -> tuple[dict[str, tuple[int, ...]], GGUFReader]:
    r = GGUFReader(path)
    return {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}, r


def _kv(r: GGUFReader, key: str):
    return r.fields[key].contents()


@pytest.mark.parametrize("arch", ARCHS)
def test_make_model_writes_each_arch_and_the_registry_streams_it(tmp_path: Path, arch: str,
                                                                 capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "m.gguf"
    assert bench_main(["make-model", str(out), "--arch", arch, "--seed", "3"]) == 0
    assert f"{arch}, " in capsys.readouterr().err
    names, r = _fields(out)
    assert _kv(r, "general.architecture") == arch
    assert arch not in REGISTRY and arch in {c.arch for c in COVERED}  # the default row streams it
    lay = load_layout(out)
    assert lay.moe_layers == MOE_LAYERS[arch]
    kinds = ("gate", "up", "down")
    assert sorted(lay.experts) == sorted(f"blk.{il}.ffn_{k}_exps.weight" for il in MOE_LAYERS[arch] for k in kinds)
    assert not any(n.endswith("_exps.weight") for n in lay.dense)
    planned = plan_model(shape_spec("tiny", arch=arch, seed=3))
    assert out.stat().st_size == planned.total_bytes and sorted(names) == sorted(t.name for t in planned.tensors)


@pytest.mark.parametrize("arch", ["qwen35moe", "qwen3next"])
def test_deltanet_archs_have_their_ssm_keys_and_an_mtp_block_outside_the_trunk(tmp_path: Path, arch: str) -> None:
    (path,) = make_model(tmp_path / "m.gguf", shape_spec("tiny", arch=arch))
    names, r = _fields(path)
    assert _kv(r, f"{arch}.block_count") == 5 and _kv(r, f"{arch}.nextn_predict_layers") == 1
    for key, want in (("ssm.conv_kernel", 4), ("ssm.state_size", 32), ("ssm.group_count", 2),
                      ("ssm.time_step_rank", 4), ("ssm.inner_size", 128), ("full_attention_interval", 2)):
        assert _kv(r, f"{arch}.{key}") == want, key
    # linear attention in layers 0 and 2, full attention (joint query + gate projection) in 1 and 3 and in the MTP
    assert names["blk.0.ssm_conv1d.weight"] == (4, 2 * 64 + 128) and "blk.0.attn_q.weight" not in names
    assert names["blk.1.attn_q.weight"] == (256, 2 * 4 * 64) and "blk.1.ssm_a" not in names
    assert ("blk.0.ssm_ba.weight" in names) == (arch == "qwen3next") != ("blk.0.ssm_alpha.weight" in names)
    assert names["blk.4.nextn.eh_proj.weight"] == (512, 256) and "blk.4.ffn_gate_exps.weight" in names
    assert names["blk.0.ffn_gate_inp_shexp.weight"] == (256,)
    if arch == "qwen35moe":
        assert _kv(r, "qwen35moe.rope.dimension_sections") == [2, 2, 4, 0]
    lay = load_layout(path)
    assert lay.n_layer == 5 and lay.n_layer_nextn == 1
    assert 4 not in lay.moe_layers and 4 not in lay.dense_bytes_by_layer
    assert not any(n.startswith("blk.4.") for n in list(lay.experts) + list(lay.dense))
    assert lay.nextn_bytes == sum(t.nbytes for t in plan_model(shape_spec("tiny", arch=arch)).tensors if t.layer == 4)
    assert "blk.0.ffn_down_shexp.weight" in lay.dense


def test_lfm2moe_convolution_layers_have_no_kv_heads_and_dense_leads(tmp_path: Path) -> None:
    (path,) = make_model(tmp_path / "m.gguf", shape_spec("tiny", arch="lfm2moe"))
    names, r = _fields(path)
    assert _kv(r, "lfm2moe.attention.head_count_kv") == [0, 0, 2, 0, 0, 2]
    assert (_kv(r, "lfm2moe.leading_dense_block_count"), _kv(r, "lfm2moe.expert_gating_func")) == (2, 2)
    assert "token_embd_norm.weight" in names and "output_norm.weight" not in names
    assert names["blk.0.shortconv.conv.weight"] == (3, 256) and "blk.2.attn_q.weight" in names
    assert "blk.1.ffn_gate.weight" in names and "blk.1.ffn_gate_exps.weight" not in names
    assert names["blk.2.exp_probs_b.bias"] == (8,)
    assert "blk.2.exp_probs_b.bias" in load_layout(path).dense


def test_llama4_and_minimax_layers(tmp_path: Path) -> None:
    (l4,) = make_model(tmp_path / "l4.gguf", shape_spec("tiny", arch="llama4"))
    names, r = _fields(l4)
    assert _kv(r, "llama4.interleave_moe_layer_step") == 2
    assert "blk.0.ffn_gate.weight" in names and "blk.1.ffn_gate_shexp.weight" in names
    (mm,) = make_model(tmp_path / "mm.gguf", shape_spec("tiny", arch="minimax-m2"))
    names, r = _fields(mm)
    assert names["blk.0.attn_q_norm.weight"] == (256,) and names["blk.0.attn_k_norm.weight"] == (128,)
    assert _kv(r, "minimax-m2.feed_forward_length") == _kv(r, "minimax-m2.expert_feed_forward_length") == 256
    assert _kv(r, "minimax-m2.expert_gating_func") == 2 and "blk.0.exp_probs_b.bias" in names


# -- real shapes (make-model --shape, --dry-run) -------------------------------------------------------------

# Published files: the original's Qwen3.6 model, bartowski's Qwen_Qwen3.6-35B-A3B-Q4_K_M.gguf, 22.3 GB (the
# original's README and its desktop campaign's CSV preamble); LiquidAI's LFM2.5-8B-A1B-Q5_K_M.gguf, the lfm2moe file
# the original streamed, whose tensor data llama.cpp reports as 5.61 GiB (256 tensors: 123 f32, 118 q5_K, 15 q6_K;
# the original's 2026-07-20-sidecar load log).
QWEN36_PUBLISHED_BYTES = 22.3e9
LFM25_PUBLISHED_GIB = 5.61


def test_qwen36_shape_is_the_published_config_within_5pct_of_the_file() -> None:
    spec = shape_spec("qwen3.6-35b-a3b")
    assert (spec.arch, spec.n_layer, spec.n_expert, spec.n_expert_used, spec.n_embd, spec.n_ff_exp) == (
        "qwen35moe", 40, 256, 8, 2048, 512)
    assert (spec.n_head, spec.n_head_kv, spec.head_dim, spec.n_vocab, spec.n_ff_shexp) == (16, 2, 256, 248320, 512)
    plan = plan_model(spec)
    kv = {k.key: k.value for k in plan.kvs}
    assert kv["qwen35moe.block_count"] == 41 and kv["qwen35moe.nextn_predict_layers"] == 1
    assert (kv["qwen35moe.ssm.inner_size"], kv["qwen35moe.ssm.group_count"], kv["qwen35moe.ssm.time_step_rank"]) == (
        4096, 16, 32)
    assert kv["qwen35moe.rope.dimension_sections"] == [11, 11, 10, 0]
    # full attention in layers 3, 7, ..., 39 and the MTP block 40; gated delta net in the other 30
    names = {t.name for t in plan.tensors}
    assert sorted(il for il in range(41) if f"blk.{il}.attn_q.weight" in names) == [*range(3, 40, 4), 40]
    assert sum(f"blk.{il}.ssm_a" in names for il in range(41)) == 30
    # Q4_K gate/up, 589824 B each per expert; down Q4_K or, in the use_more_bits layers, Q6_K (860160 B)
    nb = {(loc.layer, loc.role): loc.nb for loc in expert_locations(plan)}
    assert {nb[il, "gate"] for il in range(41)} == {2048 * 512 // 256 * 144}
    more = [il for il in range(41) if nb[il, "down"] == 512 * 2048 // 256 * 210]
    assert more == [il for il in range(41) if il < 5 or il >= 35 or (il - 5) % 3 == 2] and len(more) == 21
    assert abs(plan.total_bytes / QWEN36_PUBLISHED_BYTES - 1) < 0.05


def test_lfm2_shapes_match_the_published_q5_k_m_file() -> None:
    plan = plan_model(shape_spec("lfm2.5-8b-a1b"))
    assert len(plan.tensors) == 256
    counts = {dt: sum(t.dtype == dt for t in plan.tensors) for dt in ("f32", "q5_k", "q6_k")}
    assert counts == {"f32": 123, "q5_k": 118, "q6_k": 15}
    kv = {k.key: k.value for k in plan.kvs}
    assert kv["lfm2moe.attention.head_count_kv"] == [8 if il in (2, 6, 10, 14, 18, 21) else 0 for il in range(24)]
    gib = sum(t.nbytes for t in plan.tensors) / 2**30  # what llama.cpp reports as the file size
    assert abs(gib / LFM25_PUBLISHED_GIB - 1) < 0.05
    # LFM2-8B-A1B: the same layers with a 65536-token vocab (the tied Q6_K embedding is 62464 rows shorter)
    lfm2 = plan_model(shape_spec("lfm2-8b-a1b"))
    assert sum(t.nbytes for t in plan.tensors) - sum(t.nbytes for t in lfm2.tensors) == 62464 * 2048 // 256 * 210


@pytest.mark.parametrize(("shape", "gb"), [("qwen3.6-35b-a3b", "22.73 GB"), ("lfm2.5-8b-a1b", "6.03 GB")])
def test_dry_run_prints_the_shapes_size(tmp_path: Path, capsys: pytest.CaptureFixture, shape: str, gb: str) -> None:
    out = tmp_path / "m.gguf"
    assert bench_main(["make-model", str(out), "--shape", shape, "--dry-run"]) == 0
    printed = capsys.readouterr()
    assert printed.out.split()[1] == str(plan_model(shape_spec(shape)).total_bytes) and gb in printed.err
    assert not out.exists()


@pytest.mark.parametrize(("dtype", "qt"), [("q5_k", QT.Q5_K), ("q6_k", QT.Q6_K)])
def test_k_quant_blocks_dequantize_to_the_planned_spread(dtype: str, qt: QT) -> None:
    t = P.TensorPlan("x", (512, 64), dtype, "blocks", 0.05)
    raw = np.frombuffer(b"".join(tensor_chunks(t, 0)), dtype=np.uint8)
    x = dequantize(raw.reshape(64, -1), qt)
    assert np.all(np.isfinite(x)) and abs(float(x.mean())) < 0.05 * t.std
    assert 0.9 * t.std < float(x.std()) < 1.1 * t.std


# -- the gates, through llama.cpp and the engine (test_engine_gates.py's helpers) ------------------------------

@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("archb")
    out = {a: make_model(d / f"{a}.gguf", shape_spec("tiny", arch=a, seed=30 + i))[0] for i, a in enumerate(ARCHS)}
    # the K-quant _M mix of the real shapes: Q5_K experts, Q6_K down projections in layers 2 and 5
    mix = shape_spec("tiny", arch="lfm2moe", expert_type="q5_k", seed=40, arch_opts=(("more_bits_type", "q6_k"),))
    out["lfm2moe-k5"] = make_model(d / "lfm2moe-k5.gguf", mix)[0]
    return out


# the cache off; evictions with O_DIRECT (the default) and 2 reader lanes; evictions with buffered reads
GATES = [("--cache-mb", "0"), ("--cache-mb", "1", "--io-threads", "2"), ("--cache-mb", "1", "--no-odirect")]


@pytest.mark.engine
@pytest.mark.parametrize("flags", GATES, ids=["cache-off", "evictions-2-lanes", "evictions-no-odirect"])
@pytest.mark.parametrize("arch", ARCHS)
def test_streamed_matches_resident(models, resident, tmp_path, arch, flags):  # noqa: F811 (the imported fixture)
    trace = tmp_path / "t.route.csv"
    r = _stream(models, tmp_path, arch, *flags, "--route-trace", str(trace))
    assert r.tokens == resident(arch)
    assert r.preamble["odirect_effective"] == ("0" if "--no-odirect" in flags else "1")
    # only the trunk's routed layers are read: no MTP block, no dense layer
    assert sorted({row.layer for row in read_route_trace(trace).rows}) == MOE_LAYERS[arch]
    if flags[1] == "1":
        # 3 x 36864 B per Q4_K expert: 1 MiB holds 9, fewer than the 16 or 32 experts of the routed layers
        assert r.summary["evictions"] > 0, "the cache was meant to evict"
    else:
        assert r.summary["hit_pct"] == -1 and r.summary["mib_read_per_token"] > 0


@pytest.mark.engine
def test_q5_k_experts_with_q6_k_down_projections_match_resident(models, resident, tmp_path):  # noqa: F811
    lay = load_layout(models["lfm2moe-k5"])
    assert {t.ggml_type for t in lay.by_layer[2]} == {13, 14} and {t.ggml_type for t in lay.by_layer[3]} == {13}
    # Q5_K: 3 x 45056 B per expert (the Q6_K downs 53760 B): 2 MiB holds ~14 of the routed layers' 32
    r = _stream(models, tmp_path, "lfm2moe-k5", "--cache-mb", "2", "--io-threads", "2")
    assert r.summary["evictions"] > 0 and r.tokens == resident("lfm2moe-k5")


@pytest.mark.engine
def test_negative_control_one_wrong_expert_diverges(models, resident, tmp_path):  # noqa: F811
    """qwen35moe, layer 1 (full attention) and layer 2 (gated delta net): another expert's bytes in one slot."""
    trace = tmp_path / "t.route.csv"
    _stream(models, tmp_path, "qwen35moe", "--cache-mb", "0", "--route-trace", str(trace))
    rows = read_route_trace(trace).rows
    for layer in (1, 2):
        expert = next(r.expert for r in rows if r.phase == DECODE and r.layer == layer)
        env = {"BMOE_TEST_WRONG_EXPERT": f"{layer},{expert},{(expert + 1) % 8}"}
        assert _stream(models, tmp_path, "qwen35moe", "--cache-mb", "0", env=env).tokens != resident("qwen35moe")
