"""Eviction policies behind one interface. The engine's ExpertCache and the offline replay both use
these objects, so a replayed hit rate is the engine's hit rate.

A policy is told about hits, inserts and evictions, and asked for a victim that is not protected
(the current batch). `on_batch` is advisory (the layer about to be looked up); default no-op.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

Key = tuple[int, int]  # (layer, expert)


class Policy:
    name = "base"

    def on_batch(self, layer: int, now: int) -> None:  # noqa: B027 - advisory hook, default no-op
        pass

    def on_hit(self, key: Key, now: int) -> None:
        raise NotImplementedError

    def on_insert(self, key: Key, now: int) -> None:
        raise NotImplementedError

    def on_evict(self, key: Key) -> None:
        raise NotImplementedError

    def victim(self, protected: set[Key]) -> Key | None:
        raise NotImplementedError


class LRU(Policy):
    """Global least-recently-used, the C++ original's policy."""

    name = "lru"

    def __init__(self) -> None:
        self._order: OrderedDict[Key, None] = OrderedDict()

    def on_hit(self, key: Key, now: int) -> None:
        self._order.move_to_end(key)

    def on_insert(self, key: Key, now: int) -> None:
        self._order[key] = None

    def on_evict(self, key: Key) -> None:
        self._order.pop(key, None)

    def victim(self, protected: set[Key]) -> Key | None:
        for k in self._order:
            if k not in protected:
                return k
        return None


POLICIES: dict[str, Callable[[], Policy]] = {
    "lru": LRU,
}

ONLINE_DEFAULT = "lru"


def make_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown cache policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
