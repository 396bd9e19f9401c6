"""--drop-cold-experts: the pure decision and its application (hand-computed answers), the route_trace v2
columns, the flag rules; then the engine gates on a generated top-4 model: F=0 is the run without drops byte
for byte; a streamed run with drops equals the resident run replaying its drop decisions, with every unread
expert byte poisoned; and the replay gate sees drops moved to the wrong slot."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from harness.engine.config import parse_cli
from harness.engine.routing import cold_drop as drop
from harness.engine.stream.weights import WeightsStage
from harness.errors import UserError
from harness.formats.route_trace import DECODE, PREFILL, RouteTraceWriter, parse_route_trace, read_route_trace
from harness.replay.simulate import MIB, replay
from harness.replay.trace import load_trace
from harness.synth import ModelSpec, make_model
from tests.helpers.engine import bmoe

# -- pure ---------------------------------------------------------------------------------------------------


def test_drop_zero_does_not_make_lookups_wait_for_the_router_weights() -> None:
    """F = 0 drops nothing, so a layer's lookups and reads start at top-k time (not deferred to the weights);
    its slots are still counted. F > 0 defers (in decode; in prefill only with --drop-in-prefill)."""
    ids = np.array([[0, 1, 2, 3], [4, 5, 6, 7]], dtype=np.int32)
    zero = WeightsStage(drop.DropRule(0.0, in_prefill=True), None)
    assert not zero.on_topk(0, DECODE, ids, ids.copy()) and not zero.on_topk(1, PREFILL, ids, ids.copy())
    assert zero.totals == [8, 0, 8, 0]
    assert WeightsStage(drop.DropRule(0.5), None).on_topk(0, DECODE, ids, ids.copy())
    assert not WeightsStage(drop.DropRule(0.5), None).on_topk(0, PREFILL, ids, ids.copy())  # not in prefill


W = np.array([[0.50, 0.30, 0.15, 0.05]], dtype=np.float32)  # k=4: an even split is 0.25
IDS = np.array([[7, 3, 9, 1]], dtype=np.int32)


def test_choose_drops_only_misses_below_the_share() -> None:
    miss = np.zeros((1, 4), dtype=bool)
    assert drop.choose(W, IDS, miss, 1.0).tolist() == [[False, False, True, True]]  # shares 0.15, 0.05 < 0.25
    assert drop.choose(W, IDS, miss, 0.5).tolist() == [[False, False, False, True]]  # only 0.05 < 0.125
    assert not drop.choose(W, IDS, miss, 0.0).any()
    hit3 = np.array([[False, False, False, True]])  # the 0.05 expert is cached: kept
    assert drop.choose(W, IDS, hit3, 1.0).tolist() == [[False, False, True, False]]


def test_choose_uses_the_share_not_the_raw_weight_and_keeps_the_top_slot() -> None:
    w = W * 4  # unnormalised weights (sigmoid gating without norm): same shares, same decision
    miss = np.zeros((1, 4), dtype=bool)
    assert drop.choose(w, IDS, miss, 1.0).tolist() == [[False, False, True, True]]
    even = np.full((1, 4), 0.25, dtype=np.float32)
    assert not drop.choose(even, IDS, miss, 1.0).any()


def test_choose_in_a_prefill_batch_drops_an_expert_only_where_every_slot_qualifies() -> None:
    w = np.array([[0.6, 0.4], [0.9, 0.1]], dtype=np.float32)
    ids = np.array([[5, 2], [2, 5]], dtype=np.int32)  # 5 is low only in token 1, 2 only in token 0: keep both
    miss = np.zeros((2, 2), dtype=bool)
    assert not drop.choose(w, ids, miss, 1.0).any()
    ids2 = np.array([[5, 2], [4, 2]], dtype=np.int32)  # 2 is low in both tokens: dropped in both
    assert drop.choose(w, ids2, miss, 1.0).tolist() == [[False, True], [False, True]]


def test_apply_zeroes_the_dropped_slot_and_renormalises_the_rest() -> None:
    mask = np.array([[False, False, True, True]])
    w = W.copy()
    drop.apply(w, mask, renorm=True)
    assert w[0, 2] == 0 and w[0, 3] == 0
    np.testing.assert_allclose(w[0, :2], [0.50 / 0.80, 0.30 / 0.80], rtol=1e-6)
    w = W.copy()
    drop.apply(w, mask, renorm=False)
    assert w.tolist() == [[np.float32(0.5), np.float32(0.3), 0.0, 0.0]]


def test_apply_leaves_rows_without_a_drop_bit_for_bit() -> None:
    w = np.array([[0.1, 0.2], [0.7, 0.3]], dtype=np.float32)
    before = w.copy()
    drop.apply(w, np.array([[False, False], [False, True]]), renorm=True)
    assert w[0].tobytes() == before[0].tobytes()
    assert w[1].tolist() == [pytest.approx(1.0), 0.0]


def test_substitute_points_a_dropped_slot_at_the_heaviest_kept_expert() -> None:
    ids = IDS.copy()
    drop.substitute(ids, np.array([[False, False, True, True]]), W)
    assert ids.tolist() == [[7, 3, 7, 7]]
    ids = IDS.copy()
    drop.substitute(ids, np.array([[True, False, False, False]]), W)  # (only in a replayed file)
    assert ids.tolist() == [[3, 3, 9, 1]]


def test_final_weights_candidates_by_name() -> None:
    from harness.engine.stream.weights import is_final_weights

    for name in (b"ffn_moe_weights-3", b"ffn_moe_weights_norm-12", b"ffn_moe_weights_softmax-0",
                 b"ffn_moe_weights_scaled-7"):
        assert is_final_weights(name + b"\0junk")
    for name in (b"ffn_moe_weights_sum-3", b"ffn_moe_weights_sum_clamped-3", b"ffn_moe_weights_norm-3 (reshaped)",
                 b"ffn_moe_weighted-3", b"ffn_moe_topk-3"):
        assert not is_final_weights(name + b"\0")


def test_route_trace_v2_writes_weights_and_dropped_and_reads_v1_too(tmp_path: Path) -> None:
    p = tmp_path / "d.route.csv"
    w = RouteTraceWriter(str(p), "m.gguf", "qwen3moe", 1, 8, 2, [100], {})
    w.events(0, 3, [SimpleNamespace(layer=0, phase=DECODE, ids=np.array([[6, 2]]), residency={6: 1},
                                    weights=np.array([[0.75, 0.25]], dtype=np.float32),
                                    dropped=np.array([[False, True]]))])
    w.close()
    assert p.read_text().splitlines()[-2:] == ["0,1,3,0,0,6,0.75,1,100,0", "0,1,3,0,1,2,0.25,0,100,1"]
    f = read_route_trace(p)
    assert f.has_dropped and [r.dropped for r in f.rows] == [0, 1]
    v1 = parse_route_trace(["# route_trace v1", "# model=m arch=a n_layer=1 n_expert=8 n_expert_used=1",
                            "# layer=0 expert_bytes=1", "turn,phase,step,layer,slot,expert,weight,residency,"
                            "expert_bytes", "0,1,1,0,0,3,-1,0,1"])
    assert not v1.has_dropped and v1.rows[0].dropped == 0


def test_drop_replay_maps_steps_and_refuses_a_diverged_run(tmp_path: Path) -> None:
    p = tmp_path / "d.route.csv"
    w = RouteTraceWriter(str(p), "m.gguf", "qwen3moe", 1, 8, 2, [100], {})
    ev = SimpleNamespace(layer=0, ids=np.array([[6, 2]]), residency={}, weights=None,
                         dropped=np.array([[False, True]]))
    w.events(0, 0, [SimpleNamespace(**{**vars(ev), "phase": PREFILL})])
    w.events(0, 2, [SimpleNamespace(**{**vars(ev), "phase": DECODE})])
    w.close()
    r = drop.DropReplay(p, 1, 8, 2)
    assert r.mask(DECODE, 0, 1, np.array([[6, 2]])).tolist() == [[False, True]]  # decode index 1 = step 2
    assert not r.mask(DECODE, 0, 0, np.array([[6, 2]])).any()
    assert r.mask(PREFILL, 0, -1, np.array([[6, 2]])).tolist() == [[False, True]]
    with pytest.raises(ValueError, match="routed expert 4, the recording dropped expert 2"):
        r.mask(DECODE, 0, 1, np.array([[6, 4]]))
    with pytest.raises(UserError, match="top-4"):
        drop.DropReplay(p, 1, 8, 4)


@pytest.mark.parametrize("argv, message", [
    (["--drop-cold-experts", "0.5"], "only applies with --moe-stream"),
    (["--moe-stream", "--cache-mb", "0", "--drop-cold-experts", "0.5"], "needs a cache"),
    (["--moe-stream", "--drop-cold-experts", "1.5"], "0..1"),
    (["--drop-in-prefill"], "needs --drop-cold-experts"),
    (["--drop-no-renorm"], "needs --drop-cold-experts F or --drop-replay"),
    (["--moe-stream", "--drop-cold-experts", "1", "--drop-replay", "x.csv"], "give one of them"),
])
def test_flag_rules_are_one_line_errors(argv: list[str], message: str) -> None:
    with pytest.raises(UserError, match=message) as e:
        parse_cli(["-m", "x.gguf", *argv])
    assert "\n" not in str(e.value)


def test_lossy_and_not_reproducible_in_the_config() -> None:
    from harness.engine.config import lossy_settings

    cfg = parse_cli(["-m", "x.gguf", "--moe-stream", "--drop-cold-experts", "0.75"])
    assert [s.split(":")[0] for s in lossy_settings(cfg)] == ["--drop-cold-experts"]
    assert lossy_settings(parse_cli(["-m", "x.gguf", "--moe-stream"])) == []


# -- engine -------------------------------------------------------------------------------------------------

N = 24
STREAM = ("--moe-stream", "--cache-mb", "1", "--force-cache")  # ~5 experts per layer fit: hits and misses


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    spec = ModelSpec(expert_type="q8_0", seed=5, n_expert=16, n_expert_used=4)
    return make_model(tmp_path_factory.mktemp("drop") / "k4.gguf", spec)[0]


@pytest.fixture(scope="module")
def base(model, tmp_path_factory):
    """The streamed run without drops."""
    return _run(model, tmp_path_factory.mktemp("base"), *STREAM)


def _run(model, tmp, *flags, env=None):
    r = bmoe(model, *flags, n=N, tmp=tmp, env=env)
    assert r.rc == 0, r.stderr
    assert len(r.tokens) == N
    return r


@pytest.mark.engine
def test_drop_zero_is_the_run_without_drops_byte_for_byte(model, base, tmp_path) -> None:
    t0 = tmp_path / "f0.route.csv"
    f0 = _run(model, tmp_path, *STREAM, "--drop-cold-experts", "0", "--route-trace", str(t0))
    assert f0.stdout == base.stdout and f0.tokens == base.tokens
    assert f0.summary["hit_pct"] == base.summary["hit_pct"]
    assert f0.summary["drop_decode_slots"] == N * 4 * 4 and f0.summary["drop_decode_dropped"] == 0
    assert f0.preamble["reproducible"].startswith("no")
    assert "--drop-cold-experts" in f0.preamble["lossy"]
    rows = read_route_trace(t0).rows
    assert not any(r.dropped for r in rows)
    weights = [float(line.split(",")[6]) for line in t0.read_text().splitlines() if line[0].isdigit()]
    assert min(weights) >= 0 and len(weights) == len(rows)
    per_token: dict[tuple[int, int, int], float] = {}
    for r, w in zip(rows, weights, strict=True):
        per_token[(r.phase, r.step, r.layer)] = per_token.get((r.phase, r.step, r.layer), 0) + w
    assert all(abs(s - 1) < 1e-4 for s in per_token.values())  # qwen3moe renormalises its top-k weights


@pytest.mark.engine
@pytest.mark.parametrize("flags", [(), ("--drop-no-renorm", "--drop-in-prefill"), ("--recycle-pages", "move")],
                         ids=["renorm", "norenorm-prefill", "renorm-recycled"])
def test_drop_streamed_equals_resident_replaying_its_decisions(model, base, tmp_path, flags) -> None:
    trace = tmp_path / "d.route.csv"
    poison = {"BMOE_TEST_POISON_UNREAD": "1"}  # a matmul on an unread slice would give NaN
    st = _run(model, tmp_path, *STREAM, "--drop-cold-experts", "1", *flags, "--route-trace", str(trace), env=poison)
    assert st.tokens != base.tokens, "dropping experts changed nothing: the gate would prove nothing"
    assert 0 < st.summary["drop_decode_dropped"] < st.summary["drop_decode_slots"]
    assert (st.summary["drop_prefill_dropped"] > 0) == ("--drop-in-prefill" in flags)
    tr = read_route_trace(trace)
    dropped = [r for r in tr.rows if r.dropped]
    assert dropped and all(r.residency == 0 for r in dropped)
    if "--recycle-pages" in flags:  # a dropped slice is never read, so never given pool pages: still poisoned
        assert st.summary["pool_recycled"] > 0, st.summary
    renorm = () if "--drop-no-renorm" not in flags else ("--drop-no-renorm",)
    res = _run(model, tmp_path, "--drop-replay", str(trace), *renorm)
    assert res.stdout == st.stdout and res.tokens == st.tokens
    # the offline replay (the engine's policy) skips the dropped experts, as the engine's cache did
    r = replay(load_trace(trace), st.preamble["cfg.cache_policy"], 1 * MIB)
    assert abs(100.0 * r.hits / r.lookups - st.summary["hit_pct"]) <= 0.1


@pytest.mark.engine
def test_replay_gate_sees_drops_moved_to_the_wrong_slot(model, tmp_path) -> None:
    """Negative control: the recorded decisions with each decode token's drops moved to its slot 0 (with that
    slot's own expert id, so only the slot is wrong): the resident replay must not reproduce the streamed run."""
    trace = tmp_path / "d.route.csv"
    st = _run(model, tmp_path, *STREAM, "--drop-cold-experts", "1", "--route-trace", str(trace))
    lines = trace.read_text().splitlines()
    out, moved = [], set()
    for line in lines:
        f = line.split(",")
        if line[0].isdigit() and f[1] == "1" and f[9] == "1":
            moved.add((f[2], f[3]))
            f[9] = "0"
        out.append(f)
    for f in out:
        if f[0].isdigit() and (f[2], f[3]) in moved and f[1] == "1" and f[4] == "0":
            f[9] = "1"  # the top slot instead: the right expert id for that slot, the wrong slot
    wrong = tmp_path / "wrong.route.csv"
    wrong.write_text("\n".join(",".join(f) for f in out) + "\n")
    res = bmoe(model, "--drop-replay", str(wrong), n=N, tmp=tmp_path)
    # the wrong slot changes the next layer's routing at once: the replay stops there, loudly
    assert res.rc == 3 and "diverged from the recording" in res.stderr and res.tokens != st.tokens
