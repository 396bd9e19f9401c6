"""ExpertCache accounting (one lookup per unique expert per batch, eviction after the batch, the token-cycle
guard) independent of any policy's cleverness."""

from __future__ import annotations

import random

import pytest

from harness.engine.cache.expert_cache import ExpertCache, budget_problem, token_cycle_bytes
from harness.engine.cache.policies import online_policies

EB = [100, 100, 200]  # bytes of one expert, per layer


def test_no_cache_reads_every_batch_and_drops_the_previous_one():
    c = ExpertCache(0, EB)
    r1 = c.lookup_batch(0, [1, 2, 1])
    assert r1.misses == [1, 2] and r1.hits == [] and r1.evicted == []
    r2 = c.lookup_batch(1, [1])
    assert r2.misses == [1] and sorted(r2.evicted) == [(0, 1), (0, 2)]
    assert c.stats.lookups == 3 and c.stats.hits == 0 and c.stats.bytes_read == 300


def test_one_lookup_per_unique_expert_and_duplicates_only_promote():
    c = ExpertCache(10_000, EB, "lru")
    c.lookup_batch(0, [5, 5, 5, 6])
    assert c.stats.lookups == 2 and c.stats.bytes_read == 200


def test_eviction_never_touches_the_current_batch_and_respects_the_budget():
    c = ExpertCache(300, EB, "lru")
    rnd = random.Random(3)
    for _ in range(200):
        layer = rnd.randrange(3)
        batch = [rnd.randrange(8) for _ in range(2)]
        r = c.lookup_batch(layer, batch)
        assert not {(layer, e) for e in batch} & set(r.evicted)
        batch_bytes = len(set(batch)) * EB[layer]
        assert c.resident_bytes <= max(300, batch_bytes)


@pytest.mark.parametrize("policy", ["lru", "aged-markov"])
def test_room_for_every_expert_skips_policy_bookkeeping_without_changing_hits(policy):
    n_expert = 8
    full = n_expert * sum(EB)
    rnd = random.Random(5)
    seq = [(rnd.randrange(3), [rnd.randrange(n_expert) for _ in range(3)]) for _ in range(300)]
    fast = ExpertCache(full, EB, policy, n_expert=n_expert)
    plain = ExpertCache(full, EB, policy)  # no n_expert: the policy runs
    assert fast.never_evicts and not plain.never_evicts and fast.policy.name == "none-needed"
    for layer, batch in seq:
        a, b = fast.lookup_batch(layer, batch), plain.lookup_batch(layer, batch)
        assert (a.hits, a.misses, a.evicted) == (b.hits, b.misses, b.evicted)
    assert ExpertCache(full - 1, EB, policy, n_expert=n_expert).never_evicts is False


def test_token_cycle_and_the_guard():
    assert token_cycle_bytes(EB, 2) == 800
    assert budget_problem(0, 800) is None  # no cache is always allowed
    assert budget_problem(800, 800) is None
    msg = budget_problem(799, 800)
    assert msg is not None and "below one token cycle" in msg and "--force-cache" in msg


@pytest.mark.parametrize("policy", online_policies())
def test_deferred_eviction_decides_exactly_as_immediate(policy: str) -> None:
    """The engine looks a batch up with evict=False and evicts later (while its reads are in flight):
    the same entries must be evicted, in the same order, with the same hits."""
    rng = random.Random(7)
    eb = [100, 120, 100]
    now, later = ExpertCache(1500, eb, policy), ExpertCache(1500, eb, policy)
    for step in range(300):
        layer = step % 3
        experts = [rng.randrange(16) for _ in range(4 if step > 2 else 12)]
        a = now.lookup_batch(layer, experts)
        b = later.lookup_batch(layer, experts, evict=False)
        assert b.evicted == []
        assert later.resident_bytes >= now.resident_bytes
        evicted = later.evict_over_budget()
        assert (a.hits, a.misses, a.evicted) == (b.hits, b.misses, evicted)
        assert now.resident == later.resident and later.resident_bytes <= 1500
    assert now.stats == later.stats and now.stats.evictions > 100
