"""bailingmoe3: the synthetic file holds what llama.cpp's bailingmoe3 loader creates (KDA linear-attention layers
and gated-MLA layers told apart by the per-layer head_count_kv array, a leading dense block, a shared expert);
the layout streams only the routed experts of the MoE layers; through llama.cpp, streamed output equals
resident output (the gates)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from gguf import GGUFReader

from harness.engine.model.gguf_layout import load_layout
from harness.synth import make_model
from harness.synth.shapes import shape_spec
from tests.gates.test_engine_gates import resident  # noqa: F401  (resident: its fixture, over this module's `models`)
from tests.helpers.arch_gates import GATE_FLAGS, check_gate, check_wrong_expert_diverges
from tests.synth.test_synth_llama import greedy

TINY = shape_spec("tiny", arch="bailingmoe3", expert_type="q8_0")
E = TINY.n_expert
KDA = ("ssm_conv1d_q.weight", "ssm_conv1d_k.weight", "ssm_conv1d_v.weight", "attn_q.weight", "attn_k.weight",
       "attn_v.weight", "ssm_f_a.weight", "ssm_beta.weight", "ssm_a", "ssm_dt.bias", "ssm_g_a.weight",
       "ssm_norm.weight", "attn_output.weight")
MLA = ("attn_q.weight", "attn_kv_a_mqa.weight", "attn_kv_a_norm.weight", "attn_k_b.weight", "attn_v_b.weight",
       "attn_gate.weight", "attn_output.weight")
MOE = ("ffn_gate_inp.weight", "exp_probs_b.bias", "ffn_gate_exps.weight", "ffn_up_exps.weight",
       "ffn_down_exps.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight")
DENSE_FFN = ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")


def test_tiny_file_holds_exactly_kda_and_mla_layers_a_dense_lead_and_moe(tmp_path: Path) -> None:
    (path,) = make_model(tmp_path / "b.gguf", TINY)
    r = GGUFReader(path)
    assert r.fields["bailingmoe3.attention.head_count_kv"].contents() == [0, 0, 0, 1]  # 0: KDA, 1: MLA
    assert r.fields["bailingmoe3.leading_dense_block_count"].contents() == 1
    assert r.fields["bailingmoe3.kda.gate_lower_bound"].contents() < 0  # the loader asserts it
    want = {"token_embd.weight", "output_norm.weight", "output.weight"}
    for il in range(TINY.n_layer):
        p = f"blk.{il}."
        want |= {p + "attn_norm.weight", p + "ffn_norm.weight"}
        want |= {p + n for n in (MLA if il == 3 else KDA)}
        want |= {p + n for n in (DENSE_FFN if il == 0 else MOE)}
    got = {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}
    assert set(got) == want
    assert got["blk.3.attn_k_b.weight"] == (64, 128, TINY.n_head)  # {qk_nope, kv_lora, n_head}
    assert got["blk.0.ssm_conv1d_q.weight"] == (4, 1, 64 * TINY.n_head)
    assert got["blk.0.ssm_a"] == (1, TINY.n_head)


def test_layout_streams_only_the_moe_layers_experts(tmp_path: Path) -> None:
    (path,) = make_model(tmp_path / "b.gguf", TINY)
    lay = load_layout(path)
    assert lay.moe_layers == [1, 2, 3]  # layer 0 is the leading dense block
    assert "blk.0.ffn_down.weight" in lay.dense and "blk.1.ffn_down_shexp.weight" in lay.dense
    assert lay.dense_bytes_by_layer[0] > 0 and lay.expert_bytes(0) == 0


# -- through llama.cpp -------------------------------------------------------------------------------------------


@pytest.mark.engine
def test_loads_and_generates_varied_text(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    (path,) = make_model(tmp_path / "b.gguf", TINY)
    toks = greedy(path, 40, n_ctx=256)
    assert len(toks) == 40 and len(set(toks)) >= 13 and max(toks.count(t) for t in toks) <= 10, toks


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bailingmoe3")
    (path,) = make_model(d / "bailingmoe3.gguf", dataclasses.replace(TINY, seed=51))
    return {"bailingmoe3": path}


# 3 MoE layers x k=2 x 208896 B: one token cycle is 1.2 MiB; 2 MiB holds 10 of the 24 experts
@pytest.mark.engine
@pytest.mark.parametrize("flags", GATE_FLAGS)
def test_streamed_matches_resident(models, resident, tmp_path, flags):  # noqa: F811 (the imported fixture)
    check_gate(models, resident, tmp_path, "bailingmoe3", flags, cache_mb=2)


@pytest.mark.engine
def test_negative_control_one_wrong_expert_diverges(models, resident, tmp_path):  # noqa: F811
    check_wrong_expert_diverges(models, resident, tmp_path, "bailingmoe3", layer=3, n_expert=E)
