"""deepseek4: the synthetic file holds what llama.cpp's deepseek4 loader creates (token-id routing tables on the
first hash layers, a selection bias on the others, a shared expert, hyper-connections, compressed attention
with the indexer); the layout finds the token-routed layers in the file; through llama.cpp the hook reads the
GET_ROWS ffn_moe_topk of those layers (the route trace equals the table's rows) and streamed output equals
resident output (the gates)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.constants import GGMLQuantizationType as QT

from harness.engine.model.gguf_layout import load_layout
from harness.formats.route_trace import DECODE, read_route_trace
from harness.synth import make_model
from harness.synth.archs.deepseek4 import compress_ratios
from harness.synth.shapes import shape_spec
from tests.gates.test_engine_gates import _stream, resident  # noqa: F401  (resident: its fixture, over this module's `models`)
from tests.helpers.arch_gates import GATE_FLAGS, check_gate, check_wrong_expert_diverges
from tests.synth.test_synth_llama import greedy

TINY = shape_spec("tiny", arch="deepseek4", expert_type="q8_0")
E, K = TINY.n_expert, TINY.n_expert_used


def test_tiny_file_has_token_tables_on_the_hash_layers_and_each_compressed_attention_kind(tmp_path: Path) -> None:
    (path,) = make_model(tmp_path / "d.gguf", TINY)
    r = GGUFReader(path)
    t = {x.name: x for x in r.tensors}
    assert compress_ratios(TINY) == [0, 4, 128, 4]
    assert r.fields["deepseek4.attention.compress_ratios"].contents() == [0, 4, 128, 4]
    assert r.fields["deepseek4.hash_layer_count"].contents() == 2
    assert r.fields["deepseek4.expert_gating_func"].contents() == 4  # sqrt(softplus)
    for il in range(TINY.n_layer):
        p = f"blk.{il}."
        assert (p + "ffn_gate_tid2eid.weight" in t) == (il < 2)
        assert (p + "exp_probs_b.bias" in t) == (il >= 2)
        assert (p + "attn_compressor_kv.weight" in t) == (il != 0)
        assert (p + "indexer.proj.weight" in t) == (il in (1, 3))
        for name in ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp", "hc_attn_fn", "hc_ffn_fn", "ffn_gate_inp"):
            assert p + name + ".weight" in t
    tab = t["blk.0.ffn_gate_tid2eid.weight"]
    assert tab.tensor_type == QT.I32 and tuple(int(x) for x in tab.shape) == (K, TINY.n_vocab)
    ids = np.asarray(tab.data).reshape(TINY.n_vocab, K)
    assert ids.min() >= 0 and ids.max() < E and all(len(set(row)) == K for row in ids.tolist())
    assert len({tuple(row) for row in ids.tolist()}) > E  # tokens differ in their experts
    assert {"output_hc_fn.weight", "output_hc_base.weight", "output_hc_scale.weight", "output.weight"} <= set(t)
    # the file keeps wo_a 2-D, as the published files (the loader reshapes it)
    assert len(t["blk.0.attn_output_a.weight"].shape) == 2


def test_layout_finds_the_token_routed_layers_and_keeps_tables_and_shared_experts_resident(tmp_path: Path) -> None:
    (path,) = make_model(tmp_path / "d.gguf", TINY)
    lay = load_layout(path)
    assert lay.token_routed_layers == (0, 1)
    assert lay.moe_layers == [0, 1, 2, 3]
    assert {t.kind for t in lay.by_layer[0]} == {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"}
    assert {"blk.0.ffn_gate_tid2eid.weight", "blk.0.ffn_up_shexp.weight", "blk.3.exp_probs_b.bias"} <= set(lay.dense)


# -- through llama.cpp -------------------------------------------------------------------------------------------


@pytest.mark.engine
def test_loads_and_generates_varied_text(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    (path,) = make_model(tmp_path / "d.gguf", TINY)
    toks = greedy(path, 40, n_ctx=256)
    assert len(toks) == 40 and len(set(toks)) >= 13 and max(toks.count(t) for t in toks) <= 10, toks


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("deepseek4")
    (path,) = make_model(d / "deepseek4.gguf", dataclasses.replace(TINY, seed=41))
    return {"deepseek4": path}


@pytest.mark.engine
@pytest.mark.parametrize("flags", GATE_FLAGS)
def test_streamed_matches_resident(models, resident, tmp_path, flags):  # noqa: F811 (the imported fixture)
    check_gate(models, resident, tmp_path, "deepseek4", flags, cache_mb=3)


@pytest.mark.engine
def test_hash_layers_route_by_the_token_table(models, tmp_path):
    """Decode step s (from 1) feeds generated token s-1: its experts in a hash layer are that token's table row,
    read by the hook from the GET_ROWS ffn_moe_topk node; the other layers route by the router."""
    trace = tmp_path / "t.route.csv"
    r = _stream(models, tmp_path, "deepseek4", "--cache-mb", "0", "--route-trace", str(trace))
    tables = {t.name: np.asarray(t.data) for t in GGUFReader(models["deepseek4"]).tensors if "tid2eid" in t.name}
    got: dict[tuple[int, int], set[int]] = defaultdict(set)
    for row in read_route_trace(trace).rows:
        if row.phase == DECODE:
            got[(row.step, row.layer)].add(row.expert)
    steps = sorted({s for s, _ in got})
    assert steps == list(range(1, len(r.tokens) + 1))
    for layer in (0, 1):
        tab = tables[f"blk.{layer}.ffn_gate_tid2eid.weight"]
        for s in steps:
            assert got[(s, layer)] == set(tab[r.tokens[s - 1]].tolist()), (layer, s)
    # routed layers are not the table's: some step's experts differ from what a table row would give
    assert any(got[(s, 2)] != set(tables["blk.0.ffn_gate_tid2eid.weight"][r.tokens[s - 1]].tolist()) for s in steps)


@pytest.mark.engine
def test_negative_control_one_wrong_expert_in_a_hash_layer_diverges(models, resident, tmp_path):  # noqa: F811
    check_wrong_expert_diverges(models, resident, tmp_path, "deepseek4", layer=0, n_expert=E)


# Published: unsloth's DeepSeek-V4-Flash-0731-UD-IQ2_M, three shards of 5,257,664 + 49,956,780,160 +
# 40,964,890,464 bytes (the original's app catalog): 90,926,928,288 bytes.
PUBLISHED_BYTES = 90_926_928_288


def test_v4_flash_dry_run_within_5pct_of_the_published_and_refused_for_writing(tmp_path: Path, capsys) -> None:
    from harness.bench_cli import main as bench_main
    from harness.synth import plan_model

    spec = shape_spec("deepseek-v4-flash")
    assert (spec.n_layer, spec.n_expert, spec.n_expert_used, spec.n_embd, spec.n_ff_exp) == (43, 256, 6, 4096, 2048)
    plan = plan_model(spec)
    experts = sum(t.nbytes for t in plan.tensors if t.expert_role)
    assert experts == 43 * 256 * 3 * 4096 * 2048 // 256 * 82  # IQ2_S: 82 bytes per 256 weights
    assert sum(1 for t in plan.tensors if "tid2eid" in t.name) == 3
    assert abs(plan.total_bytes / PUBLISHED_BYTES - 1) < 0.05
    out = tmp_path / "d.gguf"
    assert bench_main(["make-model", str(out), "--shape", "deepseek-v4-flash", "--dry-run"]) == 0
    assert "deepseek4, 43 layers, 256 experts top-6" in capsys.readouterr().err
    assert bench_main(["make-model", str(out), "--shape", "deepseek-v4-flash"]) != 0
    assert "can be sized (make-model --dry-run) but not generated" in capsys.readouterr().err and not out.exists()
