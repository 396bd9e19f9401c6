"""Belady's MIN, the offline reference: replay only, the engine refuses it."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from harness.engine.cache.policies.base import Key, Policy


class Belady(Policy):
    """Belady's MIN: evict the resident entry whose next use is farthest in the future (never used
    again first). Needs the whole lookup sequence up front (`prepare_offline`), so it is replay-only.

    With equal expert sizes it is the optimum: no policy gets more hits (nor reads fewer bytes) under
    the same budget. All entries of a layer have the same size, but sizes may differ between layers;
    there farthest-next-use is the standard rule, not a proven optimum, for hits or for bytes."""

    name = "belady"
    offline = True

    def __init__(self) -> None:
        self._seq: list[Key] | None = None
        self._next_pos: list[int] = []
        self._pos = 0
        self._next: dict[Key, int] = {}
        self._heap: list[tuple[int, Key]] = []  # (-next use, key), lazy

    def prepare_offline(self, lookups: Sequence[Key]) -> None:
        """The future: every lookup the cache will do, in order (ExpertCache's unique per batch)."""
        self._seq = list(lookups)
        never = len(self._seq) + 1
        nxt = [never] * len(self._seq)
        last: dict[Key, int] = {}
        for i in range(len(self._seq) - 1, -1, -1):
            k = self._seq[i]
            nxt[i] = last.get(k, never)
            last[k] = i
        self._next_pos = nxt

    def _touch(self, key: Key, now: int) -> None:
        if self._seq is None:
            raise RuntimeError("belady is offline: call prepare_offline(lookups) before use (replay only)")
        if self._pos >= len(self._seq) or self._seq[self._pos] != key:
            raise RuntimeError(f"belady: lookup {self._pos} is {key}, not the prepared sequence's")
        n = self._next_pos[self._pos]
        self._pos += 1
        self._next[key] = n
        heapq.heappush(self._heap, (-n, key))

    on_hit = _touch
    on_insert = _touch

    def on_evict(self, key: Key) -> None:
        self._next.pop(key, None)

    def victim(self, protected: set[Key]) -> Key | None:
        h = self._heap
        skipped = []
        found = None
        while h:
            negn, k = h[0]
            if self._next.get(k) != -negn:
                heapq.heappop(h)
                continue
            if k in protected:
                skipped.append(heapq.heappop(h))
                continue
            found = k
            break
        for item in skipped:
            heapq.heappush(h, item)
        return found
