"""The early router (harness.engine.routing.early_router) and the hook's MoE-input tap.

Pure tests check the selection rules on small hand-made routers; the engine test runs llama.cpp on generated
models and checks that each layer's own router, applied to what the tap hands out at that layer, picks the
experts llama.cpp picked there (so the tap is the layer's MoE input, valid at ask time)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from harness.engine.model.gguf_layout import load_layout
from harness.engine.routing.early_router import SIGMOID, SOFTMAX, EarlyRouter, LayerRouter, slot_agreement, top_k_ids
from harness.synth import make_model
from harness.synth.shapes import shape_spec


def _router(w, bias=None, sb=None) -> LayerRouter:
    return LayerRouter(np.asarray(w, np.float32), None if bias is None else np.asarray(bias, np.float32),
                       None if sb is None else np.asarray(sb, np.float32))


def test_top_k_is_best_first_and_breaks_ties_to_the_lower_id() -> None:
    s = np.array([[0.1, 0.5, 0.5, 0.9, 0.5]], np.float32)
    assert top_k_ids(s, 3).tolist() == [[3, 1, 2]]
    assert top_k_ids(s, 3).dtype == np.int32


def test_selection_bias_changes_the_choice_only_through_the_gate() -> None:
    w = np.eye(4, dtype=np.float32)  # logits = hidden
    h = np.array([[4.0, 3.0, 0.0, -1.0]], np.float32)
    plain = EarlyRouter({0: _router(w)}, 2, SOFTMAX)
    assert plain.predict(0, h).tolist() == [[0, 1]]
    # sigmoid saturates near 1 for large logits, so a small selection bias on expert 2 wins there...
    sig = EarlyRouter({0: _router(w, sb=[0.0, 0.0, 0.6, 0.0])}, 2, SIGMOID)
    assert sig.predict(0, h).tolist() == [[2, 0]]
    # ...and the same bias loses against softmax's spread
    soft = EarlyRouter({0: _router(w, sb=[0.0, 0.0, 0.2, 0.0])}, 2, SOFTMAX)
    assert soft.predict(0, h).tolist() == [[0, 1]]


def test_router_bias_is_added_to_the_logits() -> None:
    r = EarlyRouter({0: _router(np.eye(3), bias=[0.0, 0.0, 10.0])}, 1, SOFTMAX)
    assert r.predict(0, np.array([[1.0, 0.0, 0.0]])).tolist() == [[2]]


def test_expert_groups_keep_only_the_best_groups() -> None:
    # 2 groups of 3; group 0's best two sum to 1.5, group 1's to 1.7: with one group used, expert 0 (0.9, alone the
    # best score) is masked out
    w = np.eye(6, dtype=np.float32)
    h = np.array([[0.9, 0.6, 0.0, 0.85, 0.85, 0.0]], np.float32)
    r = EarlyRouter({0: _router(w)}, 2, 0, n_groups=2, groups_used=1)
    assert r.predict(0, h).tolist() == [[3, 4]]
    assert EarlyRouter({0: _router(w)}, 2, 0).predict(0, h).tolist() == [[0, 3]]


def test_slot_agreement_counts_committed_slots_in_the_true_set() -> None:
    assert slot_agreement(np.array([[1, 2], [3, 4]]), np.array([[2, 9], [4, 3]])) == (3, 4)


@pytest.mark.parametrize("arch", ["qwen3moe", "minimax-m2"])
def test_load_reads_every_moe_layers_router(tmp_path: Path, arch: str) -> None:
    from gguf import GGUFReader

    (path,) = make_model(tmp_path / "m.gguf", shape_spec("tiny", arch=arch, seed=3))
    lay = load_layout(path)
    r = EarlyRouter.load(lay, lay.n_expert_used)
    assert sorted(r.routers) == lay.moe_layers
    ref = {t.name: t for t in GGUFReader(path).tensors}
    for il, lr in r.routers.items():
        t = ref[f"blk.{il}.ffn_gate_inp.weight"]
        from gguf.quants import dequantize

        assert np.array_equal(lr.weight, dequantize(t.data, t.tensor_type).reshape(lr.weight.shape))
        assert lr.weight.shape == (lay.n_expert, int(t.shape[0]))
        assert (lr.select_bias is not None) == (f"blk.{il}.exp_probs_b.bias" in ref)
    assert r.gating == (SIGMOID if arch == "minimax-m2" else SOFTMAX)


# -- the tap, through llama.cpp ----------------------------------------------------------------------------------

@pytest.mark.engine
@pytest.mark.parametrize("arch", ["qwen3moe", "minimax-m2"])
def test_tap_is_each_layers_moe_input_at_ask_time(tmp_path: Path, arch: str) -> None:
    """Layer l's own router on the tap at layer l reproduces llama.cpp's choice at l (up to float near-ties), in
    prefill and decode; a stale or wrong buffer would agree at chance level."""
    from harness.engine.compose import open_engine
    from harness.engine.config import parse_cli
    from harness.formats.route_trace import read_route_trace

    (path,) = make_model(tmp_path / "m.gguf", shape_spec("tiny", arch=arch, seed=5))
    trace = tmp_path / "t.route.csv"
    cfg = parse_cli(["-m", str(path), "-p", "The expert cache keeps hot experts near.", "-n", "8", "-t", "1",
                     "--moe-stream", "--cache-mb", "64", "--route-trace", str(trace)])
    eng = open_engine(cfg, io.StringIO())
    try:
        hook = eng.parts.hook
        assert hook is not None
        router = EarlyRouter.load(eng.layout, eng.k)
        got: dict[tuple[int, int, int], np.ndarray] = {}
        ahead: dict[tuple[int, int], np.ndarray] = {}

        def tap(layer: int, phase: int, decode_index: int, hidden: np.ndarray) -> None:
            assert hidden.dtype == np.float32 and hidden.shape[1] == router.routers[layer].weight.shape[1]
            got[(phase, decode_index, layer)] = router.predict(layer, hidden)
            if phase == 1 and layer + 1 in router.routers:  # the control: the next layer's router on this input
                ahead[(decode_index, layer + 1)] = router.predict(layer + 1, hidden)

        hook.taps.append(tap)
        eng.run()
    finally:
        eng.close()
    rows = read_route_trace(trace).rows
    true: dict[tuple[int, int, int], list[int]] = {}
    for r in rows:
        true.setdefault((int(r.phase), int(r.step), int(r.layer)), []).append(int(r.expert))
    decode = [key for key in got if key[0] == 1]
    assert len(decode) == 8 * len(eng.layout.moe_layers)  # one tap per layer per decode graph (-n 8: 8 decodes)
    hit = n = 0
    for (phase, di, layer), pred in got.items():
        if phase != 1:
            continue
        want = true[(1, di + 1, layer)]  # decode graph di is the trace's step di + 1
        h, m = slot_agreement(pred, np.array(want).reshape(1, -1))
        hit, n = hit + h, n + m
    assert hit / n > 0.95, f"own-router agreement {hit}/{n}"
    # another layer's input (what a stale buffer would hold) agrees far less: the check can fail
    a = [slot_agreement(p, np.array(true[(1, di + 1, layer)]).reshape(1, -1)) for (di, layer), p in ahead.items()]
    assert sum(h for h, _ in a) / sum(m for _, m in a) < 0.85
    assert any(key[0] == 0 and got[key].shape[0] > 1 for key in got)  # prefill taps hold every prompt token
