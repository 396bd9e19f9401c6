"""Score heaps behind the scored policies: a lazy min-heap, and one per layer with the phase-aware
victim rule of the aged policies and markov-duel."""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from harness.engine.policies.base import Key


class LazyMinHeap:
    """Min-heap of (score, key) where a key's score changes: stale entries are skipped on pop.
    Compacted when it grows past 4x its live size, so memory stays O(live)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Key]] = []
        self._score: dict[Key, tuple[float, int]] = {}

    def __len__(self) -> int:
        return len(self._score)

    def set(self, key: Key, score: float, tie: int) -> None:
        self._score[key] = (score, tie)
        heapq.heappush(self._heap, (score, tie, key))
        if len(self._heap) > 4 * len(self._score) + 64:
            self._heap = [(s, t, k) for k, (s, t) in self._score.items()]
            heapq.heapify(self._heap)

    def discard(self, key: Key) -> None:
        self._score.pop(key, None)

    def peek(self, protected: set[Key]) -> tuple[float, Key] | None:
        """The lowest-scored live key not in protected (protected ones are skipped, not dropped)."""
        h = self._heap
        skipped = []
        found = None
        while h:
            s, t, k = h[0]
            if self._score.get(k) != (s, t):
                heapq.heappop(h)
                continue
            if k in protected:
                skipped.append(heapq.heappop(h))
                continue
            found = (s, k)
            break
        for item in skipped:
            heapq.heappush(h, item)
        return found


class LayerHeaps:
    """One LazyMinHeap of resident entries per layer, each layer's lowest entry cached (re-read only
    for layers changed since), and a global push counter that breaks score ties (older first)."""

    def __init__(self, n_layer: int) -> None:
        self._heaps = [LazyMinHeap() for _ in range(n_layer)]
        self._head: list[tuple[float, Key] | None] = [None] * n_layer  # each layer's unprotected head
        self._dirty: set[int] = set()
        self._tie = 0

    def push(self, key: Key, score: float) -> None:
        """Set (or replace) a resident entry's score."""
        self._tie += 1
        self._heaps[key[0]].set(key, score, self._tie)
        self._dirty.add(key[0])

    def discard(self, key: Key) -> None:
        self._heaps[key[0]].discard(key)
        self._dirty.add(key[0])

    def victim(self, cur: int, protected: set[Key], base: Sequence[float], phase: float) -> Key | None:
        """Each layer's lowest-scored entry (the current layer `cur` skips the protected batch), and
        among those the one maximising base[layer] + phase x (layer steps until the layer runs again)
        / n_layer - score, so a tie goes to the layer that runs last. One number per layer."""
        heaps, head = self._heaps, self._head
        n = len(head)
        if self._dirty:
            none: set[Key] = set()
            for layer in self._dirty:
                head[layer] = heaps[layer].peek(none)
            self._dirty.clear()
        best: Key | None = None
        best_s = -math.inf
        for layer, top in enumerate(head):
            if layer == cur:  # the batch's own layer: its protected entries are skipped, not cached
                top = heaps[layer].peek(protected)
            if top is None:
                continue
            s = base[layer] + phase * ((layer - cur) % n or n) / n - top[0]
            if s > best_s:
                best_s, best = s, top[1]
        return best
