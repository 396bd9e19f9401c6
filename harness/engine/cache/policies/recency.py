"""Global recency and frequency: LRU (the C++ original's policy) and LFU."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from harness.engine.cache.policies import native
from harness.engine.cache.policies.base import Key, Policy
from harness.engine.cache.policies.heaps import LazyMinHeap


class LRU(Policy):
    """Global least-recently-used, the C++ original's policy."""

    name = "lru"

    def __init__(self) -> None:
        self._order: OrderedDict[Key, None] = OrderedDict()

    def on_hit(self, key: Key, now: int) -> None:
        self._order.move_to_end(key)

    on_promote = on_hit

    def on_insert(self, key: Key, now: int) -> None:
        self._order[key] = None

    def on_evict(self, key: Key) -> None:
        self._order.pop(key, None)

    def victim(self, protected: set[Key]) -> Key | None:
        for k in self._order:
            if k not in protected:
                return k
        return None


class LFU(Policy):
    """Least-frequently-used over the whole run: counts survive eviction (expert popularity is a
    property of the model and prompt, not of residency); ties go to the least recently used."""

    name = "lfu"

    def __init__(self) -> None:
        self._count: dict[Key, int] = {}
        self._heap = LazyMinHeap()

    def bind(self, budget_bytes: int, expert_bytes: Sequence[int]) -> None:
        self._heap = native.min_heap()

    def _touch(self, key: Key, now: int) -> None:
        c = self._count.get(key, 0) + 1
        self._count[key] = c
        self._heap.set(key, c, now)

    on_hit = _touch
    on_insert = _touch

    def on_evict(self, key: Key) -> None:
        self._heap.discard(key)

    def victim(self, protected: set[Key]) -> Key | None:
        top = self._heap.peek(protected)
        return top[1] if top else None
