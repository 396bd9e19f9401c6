"""Eviction policies behind one interface. The engine's ExpertCache and the offline replay both use
these objects, so a replayed hit rate is the engine's hit rate.

A policy is told about hits, inserts and evictions, and asked for a victim that is not protected
(the current batch). Advisory hooks default to no-ops: `bind` (the budget and per-layer expert bytes,
once, from ExpertCache) and `on_batch` (the layer about to be looked up). Every method runs on the
engine's hot path (~400 lookups per token): each is O(1) or O(log n) amortised, except `victim` of the
layer-aware policies, which looks at one candidate per layer (O(n_layer)).

One module per family: `recency` (lru, lfu), `partitioned` (layer, layer-lfu), `aged` (aged,
aged-decay, aged-markov), `duel` (markov-duel), `belady` (the offline reference); `markov` is the
routing model aged-markov and markov-duel share, `heaps` the score heaps and victim rule of the scored
ones. `offline` policies (belady) need the future access sequence (`prepare_offline`): replay only,
the engine refuses them (`make_policy`). `native` picks the compiled helper (harness/engine/native/_policyc: the
heaps, the aged core, the Markov arithmetic) when it is built, else the pure-Python reference; both take
the same decisions (BMOE_PURE_PYTHON_POLICIES=1 forces the reference).

May import: native (the compiled helper). Nothing else of the engine: the cache above uses them.
"""

from __future__ import annotations

from collections.abc import Callable

from harness.engine.cache.policies.aged import Aged, AgedDecay, AgedMarkov
from harness.engine.cache.policies.base import Key, Policy
from harness.engine.cache.policies.belady import Belady
from harness.engine.cache.policies.duel import MarkovDuel
from harness.engine.cache.policies.markov import MarkovModel
from harness.engine.cache.policies.partitioned import LayerLFU, LayerLRU
from harness.engine.cache.policies.recency import LFU, LRU

__all__ = [
    "LFU", "LRU", "ONLINE_DEFAULT", "POLICIES", "Aged", "AgedDecay", "AgedMarkov", "Belady", "Key", "LayerLFU",
    "LayerLRU", "MarkovDuel", "MarkovModel", "Policy", "is_offline", "make_policy", "online_policies",
]

POLICIES: dict[str, Callable[[], Policy]] = {
    "lru": LRU,
    "lfu": LFU,
    "layer": LayerLRU,
    "layer-lfu": LayerLFU,
    "aged": Aged,
    "aged-decay": AgedDecay,
    "aged-markov": AgedMarkov,
    "markov-duel": MarkovDuel,
    "belady": Belady,
}

# Never below LRU on either recorded trace at any budget of the cache-replay study
# (bench-data/2026-11-30-cache-replay); markov-duel closes more of qwen's gap but trails it on gptoss.
ONLINE_DEFAULT = "aged-markov"


def is_offline(name: str) -> bool:
    return bool(getattr(POLICIES[name], "offline", False))


def online_policies() -> list[str]:
    """Policies the engine may select (`--cache-policy`): all but the offline ones."""
    return [n for n in POLICIES if not is_offline(n)]


def make_policy(name: str) -> Policy:
    """An online policy by name (the engine's path). Offline policies are refused here."""
    if name not in POLICIES:
        raise ValueError(f"unknown cache policy {name!r}; known: {', '.join(online_policies())}")
    if is_offline(name):
        raise ValueError(f"cache policy {name!r} is offline-only (it needs the future access sequence): "
                         f"replay only; online: {', '.join(online_policies())}")
    return POLICIES[name]()
