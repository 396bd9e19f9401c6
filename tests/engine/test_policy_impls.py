"""The compiled policy helper (harness/engine/native/_policyc) and the pure-Python reference take the same
decisions on every path the cache drives: batches with prefill duplicates, deferred and immediate
evictions, preloads, speculative admits and forgets (tests/engine/test_cache_decisions.py pins the batch path
against the implementation before both, for each of them)."""

from __future__ import annotations

import random

import pytest

from harness.engine.cache.expert_cache import ExpertCache
from harness.engine.cache.policies import native, online_policies

IMPLS = ("compiled", "numpy")


def use(impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Select an implementation for the policies bound from now on."""
    if impl == "compiled" and native._compiled is None:
        pytest.skip("the compiled helper is not built (harness/engine/native/_policyc)")
    monkeypatch.setattr(native, "_reference", impl == "numpy")
    assert native.implementation() == impl


def drive_everything(policy: str, seed: int) -> list:
    """Every decision of a cache driven through each of its entry points, in a random mix."""
    rng = random.Random(seed)
    eb = [100, 120, 100, 80]
    cache = ExpertCache(2600, eb, policy)
    out: list = [cache.preload(2, [3, 9, 1, 30])]
    for step in range(600):
        layer = step % 4
        prefill = step < 4 or rng.random() < 0.03
        experts = [rng.randrange(40 if step > 300 else 24) for _ in range(20 if prefill else 4)]
        if rng.random() < 0.5:
            res = cache.lookup_batch(layer, experts)
            out.append((res.hits, res.misses, res.evicted))
        else:
            res = cache.lookup_batch(layer, experts, evict=False)
            out.append((res.hits, res.misses))
            if rng.random() < 0.3:  # a prefetch before the deferred evictions
                out.append(cache.admit((layer + 1) % 4, rng.randrange(40)))
            out.append(cache.evict_over_budget())
        if rng.random() < 0.2:
            ok, ev = cache.admit(rng.randrange(4), rng.randrange(48))
            out.append((ok, ev))
            spec = [k for k in cache.resident if k[1] >= 40]
            if spec and rng.random() < 0.5:
                cache.forget(spec[0])  # a speculative read that never ran
                out.append(("forget", spec[0]))
        out.append(sorted(cache.resident))
    out.append((cache.stats.hits, cache.stats.evictions, cache.resident_bytes))
    return out


@pytest.mark.parametrize("policy", online_policies())
def test_compiled_and_numpy_decide_alike_on_every_path(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if native._compiled is None:
        pytest.skip("the compiled helper is not built (harness/engine/native/_policyc)")
    runs = {}
    for impl in IMPLS:
        use(impl, monkeypatch)
        runs[impl] = [drive_everything(policy, seed) for seed in (1, 2)]
    assert runs["compiled"] == runs["numpy"]
    assert runs["numpy"][0][-1][1] > 50  # evictions did happen


def test_a_wrong_score_is_seen() -> None:
    """The comparison above can fail: one policy's decisions differ from another's on the same drive."""
    assert drive_everything("aged", 1) != drive_everything("aged-decay", 1)


@pytest.mark.parametrize("impl", IMPLS)
def test_the_switch_selects_the_implementation(impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    use(impl, monkeypatch)
    for policy in ("aged", "aged-markov", "markov-duel"):
        cache = ExpertCache(1000, [100, 100], policy)
        assert (getattr(cache.policy, "_core", None) is not None) == (impl == "compiled")
