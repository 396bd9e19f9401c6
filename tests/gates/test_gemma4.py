"""gemma4: the synthetic file holds what llama.cpp's gemma4 loader creates (fused ffn_gate_up_exps, the per-expert
ffn_down_exps.scale, a dense MLP and the router's scale in every layer, no attn_v on full-attention layers, a
tied head); the layout streams the fused tensor and down, read from the file; through llama.cpp, streamed
output equals resident output (the gates) and the .scale is read from its resident copy."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from gguf import GGUFReader

from harness.engine.model.gguf_layout import load_layout
from harness.synth import make_model, plan_model
from harness.synth.archs.gemma4 import swa_pattern
from harness.synth.shapes import shape_spec
from tests.gates.test_engine_gates import _stream, resident  # noqa: F401  (resident: its fixture, over this module's `models`)
from tests.helpers.arch_gates import GATE_FLAGS, check_gate, check_wrong_expert_diverges
from tests.synth.test_synth_llama import greedy

TINY = shape_spec("tiny", arch="gemma4", expert_type="q8_0")
E, FF, D = TINY.n_expert, TINY.n_ff_exp, TINY.n_embd


def _loader_tensors(spec) -> dict[str, tuple[int, ...]]:
    """What the pinned llama.cpp's gemma4 load_arch_tensors (+ the generic .scale pass) creates, as we write it:
    no output.weight (tied), ffn_gate_up_exps instead of gate and up, attn_v only on sliding-window layers."""
    d, e, ff, fe, hd = spec.n_embd, spec.n_expert, spec.n_ff, spec.n_ff_exp, spec.head_dim
    out = {"token_embd.weight": (d, spec.n_vocab), "output_norm.weight": (d,), "rope_freqs.weight": (hd // 2,)}
    for il, swa in enumerate(swa_pattern(spec)):
        p = f"blk.{il}."
        out |= {p + n: (d,) for n in ("attn_norm.weight", "post_attention_norm.weight", "ffn_norm.weight",
                                      "post_ffw_norm.weight", "ffn_gate_inp.scale", "pre_ffw_norm_2.weight",
                                      "post_ffw_norm_1.weight", "post_ffw_norm_2.weight")}
        out |= {
            p + "attn_q.weight": (d, spec.n_head * hd), p + "attn_k.weight": (d, spec.n_head_kv * hd),
            p + "attn_output.weight": (spec.n_head * hd, d), p + "attn_q_norm.weight": (hd,),
            p + "attn_k_norm.weight": (hd,), p + "layer_output_scale.weight": (1,),
            p + "ffn_gate.weight": (d, ff), p + "ffn_up.weight": (d, ff), p + "ffn_down.weight": (ff, d),
            p + "ffn_gate_inp.weight": (d, e), p + "ffn_gate_up_exps.weight": (d, 2 * fe, e),
            p + "ffn_down_exps.weight": (fe, d, e), p + "ffn_down_exps.scale": (e,),
        }
        if swa:
            out[p + "attn_v.weight"] = (d, spec.n_head_kv * hd)
    return out


def test_tiny_file_holds_exactly_the_loaders_tensors_and_keys(tmp_path: Path) -> None:
    (path,) = make_model(tmp_path / "g.gguf", TINY)
    r = GGUFReader(path)
    assert {t.name: tuple(int(x) for x in t.shape) for t in r.tensors} == _loader_tensors(TINY)
    assert swa_pattern(TINY) == [True, True, True, False]
    f = r.fields
    assert [bool(x) for x in f["gemma4.attention.sliding_window_pattern"].contents()] == [True, True, True, False]
    for key, want in (("embedding_length_per_layer_input", 0), ("expert_feed_forward_length", FF),
                      ("feed_forward_length", TINY.n_ff), ("attention.key_length_swa", 64),
                      ("final_logit_softcapping", 30.0)):
        assert f[f"gemma4.{key}"].contents() == want, key
    scale = next(t for t in r.tensors if t.name == "blk.0.ffn_down_exps.scale")
    assert 0.3 < float(scale.data.min()) and float(scale.data.max()) < 1.8 and float(scale.data.std()) > 0.1


def test_26b_layout_keys_are_per_layer_arrays() -> None:
    spec = dataclasses.replace(TINY, n_layer=12, arch_params=(("swa_period", 6), ("head_dim_full", 128),
                                                              ("n_head_kv_full", 1)))
    kv = {k.key: k.value for k in plan_model(spec).kvs}
    assert kv["gemma4.attention.head_count_kv"] == [2, 2, 2, 2, 2, 1] * 2
    assert kv["gemma4.attention.key_length"] == 128 and kv["gemma4.attention.key_length_swa"] == 64
    names = {t.name: t.ne for t in plan_model(spec).tensors}
    assert "blk.5.attn_v.weight" not in names and names["blk.5.attn_k.weight"] == (256, 128)
    assert names["rope_freqs.weight"] == (64,)


def test_layout_streams_the_fused_gate_up_and_down_and_keeps_the_scale_resident(tmp_path: Path) -> None:
    (path,) = make_model(tmp_path / "g.gguf", TINY)
    lay = load_layout(path)
    assert lay.moe_layers == list(range(TINY.n_layer))
    assert sorted(t.kind for t in lay.by_layer[0]) == ["ffn_down_exps", "ffn_gate_up_exps"]
    up = next(t for t in lay.by_layer[0] if t.kind == "ffn_gate_up_exps")
    assert up.nb2 == 2 * FF * D // 32 * 34  # one expert's gate and up rows, Q8_0
    assert lay.expert_bytes(0) == 3 * FF * D // 32 * 34
    assert "blk.0.ffn_down_exps.scale" in lay.dense and "blk.0.ffn_gate.weight" in lay.dense
    assert lay.token_routed_layers == ()


# -- through llama.cpp -------------------------------------------------------------------------------------------


@pytest.mark.engine
def test_loads_and_generates_varied_text(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    (path,) = make_model(tmp_path / "g.gguf", TINY)
    toks = greedy(path, 40, n_ctx=256)
    assert len(toks) == 40 and len(set(toks)) >= 13 and max(toks.count(t) for t in toks) <= 10, toks


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("gemma4")
    (path,) = make_model(d / "gemma4.gguf", dataclasses.replace(TINY, seed=31))
    return {"gemma4": path}


# 3 x 69632 B per expert (Q8_0), 4 layers x k=2: one token cycle is 1.6 MiB, 3 MiB holds 15 of the 32
@pytest.mark.engine
@pytest.mark.parametrize("flags", GATE_FLAGS)
def test_streamed_matches_resident(models, resident, tmp_path, flags):  # noqa: F811 (the imported fixture)
    check_gate(models, resident, tmp_path, "gemma4", flags, cache_mb=3)


@pytest.mark.engine
def test_negative_controls_one_wrong_expert_and_a_zeroed_down_scale_diverge(models, resident, tmp_path):  # noqa: F811
    check_wrong_expert_diverges(models, resident, tmp_path, "gemma4", layer=1, n_expert=E)
    # the per-expert scale is read from its resident (anonymous) copy: zeroing that copy changes the output
    zero = {"BMOE_TEST_ZERO_DENSE": "blk.1.ffn_down_exps.scale"}
    r = _stream(models, tmp_path, "gemma4", "--cache-mb", "0", env=zero)
    assert r.tokens != resident("gemma4")


# Published: bartowski's google_gemma-4-26B-A4B-it-Q4_K_M.gguf, which llama.cpp reports as 15.85 GiB (17.0 GB),
# 128 experts of 3.76 MiB in 30 layers (the original's route-trace findings).
PUBLISHED_GIB = 15.85


def test_26b_a4b_shape_and_size_within_5pct_of_the_published(tmp_path: Path, capsys) -> None:
    from harness.bench_cli import main as bench_main

    spec = shape_spec("gemma-4-26b-a4b")
    assert (spec.n_layer, spec.n_expert, spec.n_expert_used, spec.n_embd, spec.n_ff_exp, spec.n_ff) == (
        30, 128, 8, 2816, 704, 2112)
    plan = plan_model(spec)
    kv = {k.key: k.value for k in plan.kvs}
    assert kv["gemma4.attention.head_count_kv"] == [8, 8, 8, 8, 8, 2] * 5
    assert (kv["gemma4.attention.key_length"], kv["gemma4.attention.key_length_swa"]) == (512, 256)
    # gate_up Q4_K (2816 x 1408), down Q5_0 (704 x 2816: rows no multiple of 256)
    per_expert = 2816 * 1408 // 256 * 144 + 704 * 2816 // 32 * 22
    assert sum(t.nbytes for t in plan.tensors if t.expert_role) == 30 * 128 * per_expert
    assert len(plan.tensors) == 658  # as the published file: 30 x 22 - 5 attn_v + 3
    assert abs(plan.total_bytes / 2**30 / PUBLISHED_GIB - 1) < 0.05
    out = tmp_path / "g.gguf"
    assert bench_main(["make-model", str(out), "--shape", "gemma-4-26b-a4b", "--dry-run"]) == 0
    assert "gemma4, 30 layers, 128 experts top-8" in capsys.readouterr().err and not out.exists()
