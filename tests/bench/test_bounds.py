"""Informed bounds (harness/replay/bounds.py): told facts are the trace's, they change decisions the way
the fact should, and the engine cannot select them."""

from __future__ import annotations

import random

import numpy as np
import pytest

from harness.engine.cache.expert_cache import ExpertCache
from harness.engine.cache.policies import POLICIES, make_policy
from harness.replay.bounds import BOUNDS, NEXT_TOKEN_BONUS, Usage, make_bound
from harness.replay.report import parse_policies, run_grid
from harness.replay.simulate import replay
from harness.replay.trace import RouteTrace, parse_trace


def synth_trace(seed: int, n_layer: int = 4, n_expert: int = 16, k: int = 2, prompt: int = 3,
                decode: int = 60, eb: int = 100) -> RouteTrace:
    """Uniform random routing (the past says nothing about the next token), equal expert sizes."""
    rng = random.Random(seed)
    lines = ["# route_trace v1", f"# model=x.gguf arch=qwen3moe n_layer={n_layer} n_expert={n_expert} "
             f"n_expert_used={k}"]
    lines += [f"# layer={i} expert_bytes={eb} dense_bytes=5" for i in range(n_layer)]
    lines.append("turn,phase,step,layer,slot,expert,weight,residency,expert_bytes")
    for step in range(prompt + decode):
        phase = 0 if step < prompt else 1
        for layer in range(n_layer):
            for slot, e in enumerate(rng.sample(range(n_expert), k)):
                lines.append(f"0,{phase},{step},{layer},{slot},{e},0.5,0,{eb}")
    return parse_trace(lines, f"synth{seed}")


def test_bounds_are_offline_only() -> None:
    for name in BOUNDS:
        assert name not in POLICIES
        with pytest.raises(ValueError, match="unknown cache policy"):
            make_policy(name)
    assert parse_policies("told-popularity,lru") == ["told-popularity", "lru"]


def test_told_popularity_rate_is_the_run_long_rate() -> None:
    t = synth_trace(1)
    u = Usage(t)
    counts = np.zeros((t.n_layer, t.n_expert))
    for b in t.batches:
        for e in (b.experts if b.token < 0 else b.unique):
            counts[b.layer, e] += 1
    assert u.tokens == t.prefill_tokens + t.decode_tokens
    np.testing.assert_array_equal(u.total, counts)
    pol = make_bound("told-popularity", t, u)
    pol.bind(1000, t.expert_bytes)
    q = pol._rate(2, np.zeros(t.n_expert, np.float32), 5.0, t.k)
    np.testing.assert_allclose(q, (counts[2] + 0.5) / (u.tokens + 0.5 * t.n_expert / t.k))


def test_told_window_rate_looks_ahead_from_the_layers_next_token() -> None:
    t = synth_trace(2)
    u = Usage(t)
    pol = make_bound("told-next-16", t, u)
    pol.bind(1000, t.expert_bytes)
    pol._done[1] = 10  # layer 1 has run decode tokens 0..9: the window is tokens 10..25
    q = pol._rate(1, np.zeros(t.n_expert, np.float32), 0.0, t.k)
    used = u.decode[1, 10:26].sum(0)
    np.testing.assert_allclose(q, (used + 0.5) / (16 + 0.5 * t.n_expert / t.k))


@pytest.mark.parametrize("seed", [3, 4])
def test_told_next_token_raises_exactly_the_next_tokens_experts(seed: int) -> None:
    """Drive the cache by hand; after each decode batch the told scores of the batch's layer are the
    online ones plus the bonus on exactly the experts the layer's next token uses."""
    t = synth_trace(seed)
    u = Usage(t)
    told = make_bound("told-next-token", t, u)
    plain = POLICIES["markov-duel"]()
    caches = [ExpertCache(600, t.expert_bytes, p) for p in (told, plain)]
    checked = 0
    for b in t.batches[:-t.n_layer]:
        for c in caches:
            c.lookup_batch(b.layer, b.experts)
        for p in (told, plain):
            p._close()
        if b.token >= 0:
            diff = told._score[b.layer] - plain._score[b.layer]
            nxt = np.zeros(diff.shape[0])
            used = np.flatnonzero(u.decode[b.layer, b.token + 1])
            nxt[used[used < diff.shape[0]]] = NEXT_TOKEN_BONUS
            np.testing.assert_allclose(diff, nxt, atol=1e-9)
            checked += 1
        # the two caches may diverge in residency, but scores only depend on the routing
    assert checked > 100


def test_knowing_the_next_token_beats_the_past_on_random_routing() -> None:
    """On uniform random routing the past carries nothing, so markov-duel gains little over LRU; told the
    next token it must gain clearly. Neither may beat Belady (equal sizes: Belady is the optimum)."""
    t = synth_trace(5, decode=120)
    budget = 12 * 100  # 12 of 64 entries (T = 8 entries)
    md = replay(t, "markov-duel", budget).hit_pct
    told = replay(t, make_bound("told-next-token", t), budget).hit_pct
    bel = replay(t, "belady", budget).hit_pct
    assert told >= md + 5
    assert told <= bel + 1e-9


def test_bound_replay_refuses_another_traces_batches() -> None:
    a, b = synth_trace(6), synth_trace(7, n_layer=3)
    with pytest.raises(RuntimeError, match="not the trace's"):
        replay(b, make_bound("told-both", a), 500)


def test_run_grid_builds_bounds_fresh_per_replay() -> None:
    t = synth_trace(8)
    r1, r2 = run_grid([t], ["told-both", "told-both"], [600])
    assert r1.hit_pct == r2.hit_pct and r1.policy == "told-both"
