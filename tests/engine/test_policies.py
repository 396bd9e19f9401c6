"""Cache policy invariants, run through the engine's real ExpertCache (no mocks)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from harness.engine.cache.expert_cache import ExpertCache
from harness.engine.cache.policies import POLICIES, Belady, make_policy, online_policies
from harness.replay.simulate import ReplayResult, build_policy, replay
from harness.replay.trace import Batch, RouteTrace

_TRACES = Path(__file__).resolve().parents[2] / "data" / "route-traces" / "gptoss.route.csv"
EB = [100, 100, 120, 80]  # per-layer expert bytes, deliberately unequal


def synthetic_trace(seed: int, tokens: int = 60, n_expert: int = 16, k: int = 3,
                    eb: Sequence[int] = EB) -> RouteTrace:
    """A skewed, bursty routing pattern with a prefill batch per layer (duplicates included); `eb` the
    per-layer expert bytes."""
    rng = random.Random(seed)
    t = RouteTrace("syn", "", "test", len(eb), n_expert, k, list(eb))
    weights = [1.0 / (1 + e) for e in range(n_expert)]
    prev: dict[int, list[int]] = {}

    def pick(layer: int) -> list[int]:
        keep = [e for e in prev.get(layer, []) if rng.random() < 0.4]
        rest = [e for e in rng.choices(range(n_expert), weights, k=4 * k) if e not in keep]
        chosen = list(dict.fromkeys(keep + rest))[:k]
        prev[layer] = chosen
        return chosen

    for layer in range(len(eb)):
        routed = [e for _ in range(5) for e in pick(layer)]
        uniq = tuple(dict.fromkeys(routed))
        t.batches.append(Batch(layer, tuple(routed), -1, uniq, (0,) * len(uniq)))
    t.prefill_tokens = 5
    for tok in range(tokens):
        for layer in range(len(eb)):
            ex = tuple(pick(layer))
            t.batches.append(Batch(layer, ex, tok, ex, (0,) * len(ex)))
    t.decode_tokens = tokens
    return t


def run_checked(trace: RouteTrace, name: str, budget: int) -> list[list]:
    """Replay with the invariants asserted after every batch; returns the eviction log."""
    cache = ExpertCache(budget, trace.expert_bytes, build_policy(name, trace))
    log = []
    for b in trace.batches:
        before = set(cache.resident)
        res = cache.lookup_batch(b.layer, b.experts)
        batch_keys = {(b.layer, e) for e in b.unique}
        assert not batch_keys & set(res.evicted), f"{name} evicted an entry of the current batch"
        assert set(res.evicted) <= before, f"{name} evicted something not resident"
        assert sorted(res.hits + res.misses) == sorted(b.unique)
        assert cache.resident_bytes == sum(trace.expert_bytes[layer] for layer, _ in cache.resident)
        if cache.resident_bytes > budget:  # only allowed when nothing but the batch is left
            assert cache.resident <= batch_keys, f"{name} left {cache.resident_bytes} > {budget} bytes"
        log.append(list(res.evicted))
    return log


@pytest.mark.parametrize("name", list(POLICIES))
@pytest.mark.parametrize("budget", [150, 700, 1500, 4000])
def test_invariants_and_determinism(name: str, budget: int) -> None:
    trace = synthetic_trace(seed=budget)
    first = run_checked(trace, name, budget)
    assert first == run_checked(trace, name, budget), f"{name} is not deterministic"
    assert any(first), "the budget never forced an eviction: the test would prove nothing"


def equal_size_belady(trace: RouteTrace, budget: int) -> ReplayResult:
    """Belady on the trace with every expert at the smallest expert size: an upper bound on the hits
    of any policy under `budget` with the real sizes (see the test below)."""
    return replay(replace(trace, expert_bytes=[min(trace.expert_bytes)] * trace.n_layer), "belady", budget)


@pytest.mark.parametrize("seed", [7, 8])
@pytest.mark.parametrize("budget", [700, 1500, 4000])
def test_belady_beats_every_online_policy_with_equal_sizes(seed: int, budget: int) -> None:
    """With equal sizes the budget holds a fixed number of entries, and farthest-next-use (Belady's
    MIN) is the optimum: after each batch it keeps, besides the batch, the entries used soonest, and
    any other choice can be exchanged for it without losing a hit. So no policy gets more hits, nor
    (bytes = misses x the one size) reads fewer bytes."""
    trace = synthetic_trace(seed, eb=[100] * len(EB))
    best = replay(trace, "belady", budget)
    for name in online_policies():
        r = replay(trace, name, budget)
        assert r.hits <= best.hits and r.bytes_read >= best.bytes_read, name


@pytest.mark.parametrize("budget", [700, 1500, 4000])
def test_equal_size_belady_bounds_every_online_policy_with_unequal_sizes(budget: int) -> None:
    """With unequal sizes Belady is not the optimum (next test), so it bounds nothing. What holds: a
    budget of B bytes never holds more than B / (smallest expert bytes) entries, so every policy's
    residency after each batch is also allowed in a cache whose experts all have the smallest size,
    where Belady is optimal (test above). Its hits bound every policy's hits, and its misses x the
    smallest size every policy's bytes from below."""
    trace = synthetic_trace(seed=7)
    bound = equal_size_belady(trace, budget)
    for name in online_policies():
        r = replay(trace, name, budget)
        assert r.hits <= bound.hits and r.bytes_read >= bound.bytes_read, name


def test_belady_is_not_optimal_with_unequal_sizes() -> None:
    """Why the two tests above compare what they compare: layer-0 experts 3 bytes, layer-1 experts 1
    byte, budget 5, lookups A=(0,0) a=(1,0) B=(0,1) b=(1,1) A a. At B (7 bytes resident) Belady
    evicts a, used farthest ahead, and must then evict A as well; evicting A alone would have kept a
    for the last lookup. The per-layer partition does that: one hit and 3 bytes fewer than Belady."""
    t = RouteTrace("unequal", "", "test", 2, 2, 1, [3, 1])
    for tok, e in enumerate((0, 1, 0)):
        for layer in range(2):
            t.batches.append(Batch(layer, (e,), tok, (e,), (0,)))
    t.decode_tokens = 3
    belady, layer = replay(t, "belady", 5), replay(t, "layer", 5)
    assert (belady.hits, belady.bytes_read) == (0, 12)
    assert (layer.hits, layer.bytes_read) == (1, 11)
    assert layer.hits <= equal_size_belady(t, 5).hits


def test_lru_duplicate_in_batch_promotes() -> None:
    # budget for two layer-0 entries; batch (1, 2, 1): 1 is used last, so 2 is the LRU victim
    cache = ExpertCache(200, EB, "lru")
    cache.lookup_batch(0, [1, 2, 1])
    assert cache.lookup_batch(0, [3]).evicted == [(0, 2)]
    assert cache.stats.lookups == 3  # the duplicate was not a lookup


def test_aged_beats_flooding_where_lru_hits_nothing() -> None:
    # every token routes the same 2 experts per layer; budget 6 entries < T = 8 entries
    t = RouteTrace("cyc", "", "test", 4, 8, 2, [100] * 4)
    for tok in range(50):
        for layer in range(4):
            t.batches.append(Batch(layer, (0, 1), tok, (0, 1), (0, 0)))
    t.decode_tokens = 50
    assert replay(t, "lru", 600).hits == 0
    aged = replay(t, "aged", 600)
    assert aged.hit_pct > 40
    assert aged.hits <= replay(t, "belady", 600).hits


def test_registry_marks_belady_offline() -> None:
    assert "belady" in POLICIES and "belady" not in online_policies()
    with pytest.raises(ValueError, match="offline"):
        make_policy("belady")
    with pytest.raises(ValueError, match="unknown cache policy"):
        make_policy("nope")
    for name in online_policies():
        assert make_policy(name).name == name


def test_belady_refuses_without_future_or_a_different_future() -> None:
    cache = ExpertCache(1000, EB, Belady())
    with pytest.raises(RuntimeError, match="prepare_offline"):
        cache.lookup_batch(0, [1])
    pol = Belady()
    pol.prepare_offline([(0, 1), (0, 2)])
    cache = ExpertCache(1000, EB, pol)
    with pytest.raises(RuntimeError, match="prepared sequence"):
        cache.lookup_batch(0, [2])


def test_layer_partition_keeps_each_layer_near_its_share() -> None:
    trace = synthetic_trace(seed=3, tokens=80)
    budget = 1600
    cache = ExpertCache(budget, trace.expert_bytes, "layer")
    for b in trace.batches:
        cache.lookup_batch(b.layer, b.experts)
    share = [budget * e / sum(EB) for e in EB]
    per_layer = [sum(EB[layer] for layer, _ in cache.resident if layer == i) for i in range(len(EB))]
    for i, (have, quota) in enumerate(zip(per_layer, share, strict=True)):
        assert have <= quota + 3 * EB[i], (i, have, quota)  # at most one batch (k = 3) over


def _alternating_trace() -> RouteTrace:
    """Each of 4 layers alternates between experts {0, 1} and {2, 3} over 80 tokens."""
    t = RouteTrace("alt", "", "test", 4, 8, 2, [100] * 4)
    for tok in range(80):
        for layer in range(4):
            ex = (0, 1) if tok % 2 == 0 else (2, 3)
            t.batches.append(Batch(layer, ex, tok, ex, (0, 0)))
    t.decode_tokens = 80
    return t


def test_aged_markov_learns_alternating_routing() -> None:
    # room for 12 entries (3 per layer): recency keeps the pair just used (wrong every time), the
    # transition predictor keeps the other
    t = _alternating_trace()
    aged = replay(t, "aged", 1200).hits
    markov = replay(t, "aged-markov", 1200).hits
    assert markov > aged + 100
    assert markov <= replay(t, "belady", 1200).hits


@pytest.mark.parametrize("name", list(POLICIES))
def test_invariants_on_a_real_trace(name: str) -> None:
    from harness.replay.trace import load_trace

    run_checked(load_trace(_TRACES), name, 1500 * 1048576)


@pytest.mark.parametrize("name", online_policies())
def test_preload_then_batches_keep_invariants(name: str) -> None:
    # ExpertCache.preload inserts outside any batch (the engine's --cache-preload)
    trace = synthetic_trace(seed=11)
    cache = ExpertCache(900, trace.expert_bytes, name)
    assert cache.preload(3, [15, 14, 13]) == [15, 14, 13]
    for b in trace.batches:
        res = cache.lookup_batch(b.layer, b.experts)
        assert not {(b.layer, e) for e in b.unique} & set(res.evicted)
        assert cache.resident_bytes <= 900 or cache.resident <= {(b.layer, e) for e in b.unique}


def test_markov_duel_learns_alternating_routing() -> None:
    t = _alternating_trace()
    # the used-now weight argues for the pair just used, the transition counts for the other one
    assert replay(t, "markov-duel", 1200).hits > replay(t, "aged", 1200).hits + 80


def test_markov_duel_switches_to_fast_aging_when_routing_shifts() -> None:
    # a long prompt makes experts 0-5 popular, then decode routes only among 6-11 (three at a time, in
    # a random order): run-long rates keep the stale prompt favourites; the duel must pick an aging
    # candidate and do at least as well as the no-aging one alone
    rng = random.Random(3)
    t = RouteTrace("shift", "", "test", 4, 16, 3, [100] * 4)
    for layer in range(4):
        routed = tuple(e for _ in range(30) for e in rng.sample(range(6), 3))
        uniq = tuple(dict.fromkeys(routed))
        t.batches.append(Batch(layer, routed, -1, uniq, (0,) * len(uniq)))
    t.prefill_tokens = 30
    for tok in range(120):
        for layer in range(4):
            ex = tuple(rng.sample(range(6, 12), 3))
            t.batches.append(Batch(layer, ex, tok, ex, (0,) * 3))
    t.decode_tokens = 120
    duel = POLICIES["markov-duel"]()
    hits = replay(t, duel, 2000).hits
    assert duel.ages[int(duel._duel.argmax())] > 0  # type: ignore[attr-defined]
    from harness.engine.cache.policies import MarkovDuel

    assert hits >= replay(t, MarkovDuel(ages=(0.0,)), 2000).hits
