"""Score heaps behind the scored policies: a lazy min-heap, and one per layer with the phase-aware
victim rule of the aged policies and markov-duel."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence

from harness.engine.cache.policies.base import Key


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

    def set_many(self, items: list[tuple[Key, float, int]]) -> None:
        """`set` for each (key, score, tie) at once: when they replace most live keys (a layer's re-score)
        the heap is rebuilt from the live scores instead of pushed into (the same live set, so the same
        `peek`)."""
        score = self._score
        for key, s, tie in items:
            score[key] = (s, tie)
        if 2 * len(items) >= len(score):
            self._heap = [(s, t, k) for k, (s, t) in score.items()]
            heapq.heapify(self._heap)
        else:
            for key, s, tie in items:
                heapq.heappush(self._heap, (s, tie, key))

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
    for layers changed since), and a global push counter that breaks score ties (older first).
    `victim`'s per-layer numbers are cached too: recomputed for every layer only when the batch's layer,
    `base` or `phase` change (once per batch), else only for the layers changed since."""

    def __init__(self, n_layer: int) -> None:
        self._heaps = [LazyMinHeap() for _ in range(n_layer)]
        self._head: list[tuple[float, Key] | None] = [None] * n_layer  # each layer's unprotected head
        self._dirty: set[int] = set()
        self._tie = 0
        self._s: list[float] = [-math.inf] * n_layer  # each layer's victim number (-inf: no entry)
        self._s_for: tuple[int, float, list[float]] | None = None  # the (cur, phase, base) _s is for
        self._ph: dict[int, list[float]] = {}
        self._ph_phase = math.nan
        self._cur_top: tuple[int, set[Key], tuple[float, Key] | None] | None = None  # cur's protected peek

    def _phase_term(self, cur: int, phase: float, n: int) -> list[float]:
        """phase x (layer steps from `cur` until each layer runs again) / n, per layer (kept per cur)."""
        if self._ph_phase != phase:
            self._ph, self._ph_phase = {}, phase
        ph = self._ph.get(cur)
        if ph is None:
            ph = self._ph[cur] = [phase * ((layer - cur) % n or n) / n for layer in range(n)]
        return ph

    def push(self, key: Key, score: float) -> None:
        """Set (or replace) a resident entry's score."""
        self._tie += 1
        self._heaps[key[0]].set(key, score, self._tie)
        self._dirty.add(key[0])

    def push_many(self, layer: int, keys: list[Key], scores: list[float]) -> None:
        """`push` of each key of `layer` in order (the same ties), in one heap update."""
        t = self._tie
        self._tie = t + len(keys)
        self._heaps[layer].set_many([(k, s, t + i) for i, (k, s) in enumerate(zip(keys, scores, strict=True), 1)])
        self._dirty.add(layer)

    def discard(self, key: Key) -> None:
        self._heaps[key[0]].discard(key)
        self._dirty.add(key[0])

    def victim(self, cur: int, protected: set[Key], base: Sequence[float], phase: float) -> Key | None:
        """Each layer's lowest-scored entry (the current layer `cur` skips the protected batch), and
        among those the one maximising base[layer] + phase x (layer steps until the layer runs again)
        / n_layer - score, so a tie goes to the layer that runs last. One number per layer."""
        heaps, head, s = self._heaps, self._head, self._s
        n = len(head)
        f = self._s_for
        if f is None or f[0] != cur or f[1] != phase or f[2] != base:
            todo: Iterable[int] = range(n)
            self._s_for = (cur, phase, list(base))
        else:
            todo = self._dirty
        c = self._cur_top
        if c is None or c[0] != cur or c[1] is not protected or cur in self._dirty:
            c = self._cur_top = (cur, protected, heaps[cur].peek(protected))  # the batch's own layer
        if self._dirty:
            none: set[Key] = set()
            for layer in self._dirty:
                head[layer] = heaps[layer].peek(none)
        ph = self._phase_term(cur, phase, n)
        if todo is self._dirty:
            for layer in todo:
                top = head[layer]
                s[layer] = -math.inf if top is None else base[layer] + ph[layer] - top[0]
        else:
            s[:] = [-math.inf if t is None else b + p - t[0] for b, p, t in zip(base, ph, head, strict=True)]
        self._dirty = set()
        top = c[2]  # the batch's own layer: its protected entries skipped
        s[cur] = -math.inf if top is None else base[cur] + ph[cur] - top[0]
        best_s = max(s)
        if best_s == -math.inf:
            return None
        best = s.index(best_s)  # the first layer with the largest number, as a strict > scan finds
        return top[1] if best == cur else head[best][1]  # type: ignore[index]

