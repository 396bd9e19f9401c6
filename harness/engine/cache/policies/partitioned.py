"""Per-layer budget partitions: every layer gets the same number of entries' worth of bytes, with LRU
(`layer`) or LFU (`layer-lfu`) inside each layer."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

from harness.engine.cache.policies import native
from harness.engine.cache.policies.base import Key, Policy
from harness.engine.cache.policies.heaps import LazyMinHeap


class _Partitioned(Policy):
    """A per-layer budget partition: every layer gets the same number of entries' worth of bytes
    (budget x expert_bytes[L] / sum of expert bytes). The victim comes from the layer most over its
    share that has an unprotected entry; within the layer the subclass picks (`_pick`)."""

    def __init__(self) -> None:
        self._quota: list[float] = []
        self._eb: list[int] = []
        self._res: list[int] = []  # resident bytes per layer
        self._n: list[int] = []  # resident entries per layer
        self._over: list[float] = []  # resident bytes less the share, per layer
        self._prot: tuple[set[Key], dict[int, int]] | None = None  # protected entries per layer, of the last set

    def bind(self, budget_bytes: int, expert_bytes: Sequence[int]) -> None:
        total = sum(expert_bytes) or 1
        self._eb = list(expert_bytes)
        self._quota = [budget_bytes * b / total for b in expert_bytes]
        self._res = [0] * len(expert_bytes)
        self._n = [0] * len(expert_bytes)
        self._over = [r - q for r, q in zip(self._res, self._quota, strict=True)]

    def _add(self, key: Key) -> None:
        layer = key[0]
        self._res[layer] += self._eb[layer]
        self._n[layer] += 1
        self._over[layer] = self._res[layer] - self._quota[layer]

    def on_evict(self, key: Key) -> None:
        layer = key[0]
        self._res[layer] -= self._eb[layer]
        self._n[layer] -= 1
        self._over[layer] = self._res[layer] - self._quota[layer]
        self._drop(key)

    def victim(self, protected: set[Key]) -> Key | None:
        p = self._prot
        if p is None or p[0] is not protected:  # counted once per protected set (once per batch)
            counts: dict[int, int] = {}
            for layer, _ in protected:
                counts[layer] = counts.get(layer, 0) + 1
            p = self._prot = (protected, counts)
        prot_layers = p[1]
        over = self._over
        top = max(over, default=-math.inf)
        first = over.index(top) if over else -1
        if first >= 0 and self._n[first] > prot_layers.get(first, 0):
            return self._pick(first, protected)  # the first layer most over its share has a candidate
        best, best_over = -1, -math.inf
        for layer, q in enumerate(self._quota):
            if self._n[layer] > prot_layers.get(layer, 0):
                over = self._res[layer] - q
                if over > best_over:
                    best, best_over = layer, over
        return None if best < 0 else self._pick(best, protected)

    def _drop(self, key: Key) -> None:
        raise NotImplementedError

    def _pick(self, layer: int, protected: set[Key]) -> Key | None:
        raise NotImplementedError


class LayerLRU(_Partitioned):
    """Per-layer budget partition, LRU inside each layer."""

    name = "layer"

    def __init__(self) -> None:
        super().__init__()
        self._order: dict[int, OrderedDict[Key, None]] = {}

    def on_hit(self, key: Key, now: int) -> None:
        self._order[key[0]].move_to_end(key)

    on_promote = on_hit

    def on_insert(self, key: Key, now: int) -> None:
        self._add(key)
        self._order.setdefault(key[0], OrderedDict())[key] = None

    def _drop(self, key: Key) -> None:
        self._order[key[0]].pop(key, None)

    def _pick(self, layer: int, protected: set[Key]) -> Key | None:
        for k in self._order[layer]:
            if k not in protected:
                return k
        return None


class LayerLFU(_Partitioned):
    """Per-layer budget partition, LFU (run-long counts, LRU ties) inside each layer."""

    name = "layer-lfu"

    def __init__(self) -> None:
        super().__init__()
        self._count: dict[Key, int] = {}
        self._heaps: dict[int, LazyMinHeap] = {}
        self._new_heap = LazyMinHeap

    def bind(self, budget_bytes: int, expert_bytes: Sequence[int]) -> None:
        super().bind(budget_bytes, expert_bytes)
        self._new_heap = native.min_heap

    def _touch(self, key: Key, now: int) -> None:
        c = self._count.get(key, 0) + 1
        self._count[key] = c
        h = self._heaps.get(key[0])
        if h is None:
            h = self._heaps[key[0]] = self._new_heap()
        h.set(key, c, now)

    def on_hit(self, key: Key, now: int) -> None:
        self._touch(key, now)

    def on_insert(self, key: Key, now: int) -> None:
        self._add(key)
        self._touch(key, now)

    def _drop(self, key: Key) -> None:
        self._heaps[key[0]].discard(key)

    def _pick(self, layer: int, protected: set[Key]) -> Key | None:
        top = self._heaps[layer].peek(protected)
        return top[1] if top else None
