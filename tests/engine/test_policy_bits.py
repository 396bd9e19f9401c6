"""The compiled policies' arithmetic gives numpy's bits, not only its decisions: markov-duel's candidate
scores after every close, compiled and numpy side by side on the recorded Qwen routing; and the two
things the compiled close relies on about numpy's log2 on this machine (a table of log2 of 1..64 is what
numpy gives each of them anywhere in an array; a value's float32 log2 does not depend on its place)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.engine.cache.expert_cache import ExpertCache
from harness.engine.cache.policies import native
from harness.replay import bookkeeping as bk


def test_the_staleness_table_is_numpys_log2_at_every_place() -> None:
    tab = np.log2(np.arange(1.0, 65.0))
    for n in range(1, 300):
        for v in range(1, 65):
            assert (np.log2(np.full(n, float(v))) == tab[v - 1]).all()
    rng = np.random.default_rng(1)
    for n in range(1, 300):
        a = rng.integers(1, 65, n).astype(np.float64)
        out = np.empty(n)
        np.log2(a, out=out)
        assert out.tobytes() == tab[a.astype(int) - 1].tobytes()


@pytest.mark.parametrize("n", [*range(1, 40), 64, 128, 256])
def test_float32_log2_does_not_depend_on_the_place(n: int) -> None:
    rng = np.random.default_rng(n)
    for _ in range(50):
        q = rng.uniform(1e-4, 2.0, n).astype(np.float32)
        r = np.exp(rng.uniform(-8, 8, n)).astype(np.float32)
        both = np.concatenate([q, r])
        np.log2(both, out=both)
        assert both.tobytes() == np.concatenate([np.log2(q), np.log2(r)]).tobytes()


def test_markov_duel_scores_are_numpys_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    if native._compiled is None:
        pytest.skip("the compiled helper is not built (harness/engine/native/_policyc)")
    w = bk.workload("qwen")
    caches = {}
    for impl, env in (("numpy", "1"), ("compiled", "0")):
        monkeypatch.setattr(native, "_reference", env == "1")
        caches[impl] = ExpertCache(2000 * bk.MIB, w.expert_bytes, "markov-duel", n_expert=w.n_expert)
    assert caches["compiled"].policy._c is not None and caches["numpy"].policy._c is None
    compared = 0
    for i, (layer, experts, _) in enumerate(w.batches[:3000]):
        out = []
        for cache in caches.values():
            ev = cache.evict_over_budget() if i else []
            res = cache.lookup_batch(layer, experts, evict=False)
            out.append((ev, res.hits, res.misses))
        assert out[0] == out[1]
        a, b = (c.policy for c in caches.values())
        prev = w.batches[i - 1][0] if i else None
        if prev is not None and a._pred[prev] is not None:
            assert a._pred[prev].tobytes() == b._pred[prev].tobytes()
            assert a._duel.tobytes() == b._duel.tobytes()
            compared += 1
    assert compared > 2500


@pytest.mark.parametrize("budget", [0, 700, 10**9])
def test_the_compiled_lookup_and_evict_loops_are_the_reference(budget: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """ExpertCache's compiled lookup and eviction loops (_policyc.lookup, .evict) against its Python loops: no
    cache, a small one, one that never evicts; prefill duplicates; numpy integers as experts."""
    if native._compiled is None:
        pytest.skip("the compiled helper is not built (harness/engine/native/_policyc)")
    rng = np.random.default_rng(budget)
    batches = [(s % 3, [int(e) for e in rng.integers(0, 12, 9 if s < 3 else 3)]) for s in range(300)]
    runs = {}
    for impl, env in (("numpy", "1"), ("compiled", "0")):
        monkeypatch.setattr(native, "_reference", env == "1")
        for policy in ("lru", "layer-lfu", "aged-markov", "markov-duel"):
            cache = ExpertCache(budget, [100, 50, 100], policy, n_expert=12)
            assert (cache._lookup is None) == (impl == "numpy")
            out = []
            for i, (layer, experts) in enumerate(batches):
                ids = np.array(experts, np.int32) if i % 2 else experts
                res = cache.lookup_batch(layer, ids, evict=i % 3 == 0)
                out.append((res.layer, res.hits, res.misses, res.evicted, cache.evict_over_budget(),
                            cache.resident_bytes, sorted(cache.resident)))
            out.append(vars(cache.stats))
            runs[impl, policy] = out
    for policy in ("lru", "layer-lfu", "aged-markov", "markov-duel"):
        assert runs["numpy", policy] == runs["compiled", policy], policy
    if budget == 700:
        assert runs["numpy", "lru"][-1]["evictions"] > 100
