"""Eviction policies behind one interface. The engine's ExpertCache and the offline replay both use
these objects, so a replayed hit rate is the engine's hit rate.

A policy is told about hits, inserts and evictions, and asked for a victim that is not protected
(the current batch). Advisory hooks default to no-ops: `bind` (the budget and per-layer expert bytes,
once, from ExpertCache) and `on_batch` (the layer about to be looked up). Every method runs on the
engine's hot path (~400 lookups per token): each is O(1) or O(log n) amortised, except `victim` of the
layer-aware policies, which looks at one candidate per layer (O(n_layer)).

`offline` policies (belady) need the future access sequence (`prepare_offline`): replay only, the
engine refuses them (`ONLINE_POLICIES`).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np

Key = tuple[int, int]  # (layer, expert)


class Policy:
    name = "base"
    offline = False

    def bind(self, budget_bytes: int, expert_bytes: Sequence[int]) -> None:  # noqa: B027 - advisory
        """Told once by ExpertCache: the byte budget and each layer's expert bytes."""

    def on_batch(self, layer: int, now: int) -> None:  # noqa: B027 - advisory hook, default no-op
        pass

    def on_hit(self, key: Key, now: int) -> None:
        raise NotImplementedError

    def on_promote(self, key: Key, now: int) -> None:  # noqa: B027 - advisory hook, default no-op
        """A duplicate of an expert already looked up in this batch (a prefill batch is the union of
        every prompt token's experts): not a lookup, only a promotion."""

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


class _LazyMinHeap:
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


def _phase_victim(heaps: list[_LazyMinHeap], head: list[tuple[float, Key] | None], dirty: set[int], cur: int,
                  protected: set[Key], base: Sequence[float], phase: float) -> Key | None:
    """The victim rule of the layer-aware policies (aged*, markov-duel): each layer's lowest-scored
    entry (its cached head, re-read when the layer is dirty; the current layer skips the protected
    batch), and among those the one maximising base[layer] + phase x (layer steps until the layer runs
    again) / n_layer - score, so a tie goes to the layer that runs last. One number per layer."""
    n = len(head)
    if dirty:
        none: set[Key] = set()
        for layer in dirty:
            head[layer] = heaps[layer].peek(none)
        dirty.clear()
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


class LFU(Policy):
    """Least-frequently-used over the whole run: counts survive eviction (expert popularity is a
    property of the model and prompt, not of residency); ties go to the least recently used."""

    name = "lfu"

    def __init__(self) -> None:
        self._count: dict[Key, int] = {}
        self._heap = _LazyMinHeap()

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


class _Partitioned(Policy):
    """A per-layer budget partition: every layer gets the same number of entries' worth of bytes
    (budget x expert_bytes[L] / sum of expert bytes). The victim comes from the layer most over its
    share that has an unprotected entry; within the layer the subclass picks (`_pick`)."""

    def __init__(self) -> None:
        self._quota: list[float] = []
        self._eb: list[int] = []
        self._res: list[int] = []  # resident bytes per layer
        self._n: list[int] = []  # resident entries per layer

    def bind(self, budget_bytes: int, expert_bytes: Sequence[int]) -> None:
        total = sum(expert_bytes) or 1
        self._eb = list(expert_bytes)
        self._quota = [budget_bytes * b / total for b in expert_bytes]
        self._res = [0] * len(expert_bytes)
        self._n = [0] * len(expert_bytes)

    def _add(self, key: Key) -> None:
        self._res[key[0]] += self._eb[key[0]]
        self._n[key[0]] += 1

    def on_evict(self, key: Key) -> None:
        self._res[key[0]] -= self._eb[key[0]]
        self._n[key[0]] -= 1
        self._drop(key)

    def victim(self, protected: set[Key]) -> Key | None:
        prot_layers: dict[int, int] = {}
        for layer, _ in protected:
            prot_layers[layer] = prot_layers.get(layer, 0) + 1
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
        self._heaps: dict[int, _LazyMinHeap] = {}

    def _touch(self, key: Key, now: int) -> None:
        c = self._count.get(key, 0) + 1
        self._count[key] = c
        self._heaps.setdefault(key[0], _LazyMinHeap()).set(key, c, now)

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


class Aged(Policy):
    """Phase-aware, frequency-protected recency (own design, aimed at sequential flooding).

    Layers repeat in a fixed order, so an entry of layer L can next be used only when L comes round
    again. Age is counted in *opportunities* (runs of the entry's own layer since its last use), not
    in global lookups, and among equally aged entries the one whose layer comes round last is
    evicted (global LRU does the opposite: it evicts the layer about to run, hence 0% under T).
    Frequency buys time: each doubling of an entry's use count (prefill duplicates count: a prompt
    token's use is a use) is worth `w` opportunities of age. With `decay` < 1 the count is decayed by
    that factor per missed opportunity (frequency with decay).

    Evicts the entry maximising  age_opps + delta_L / n_layer - w * log2(count), where delta_L is the
    number of layer steps until L runs again. The per-entry part is time-invariant, so each layer
    keeps a lazy min-heap of it and caches its head; `victim` re-reads only the heads that changed
    and compares one number per layer (O(n_layer) float compares + O(log n) heap work).
    """

    name = "aged"

    def __init__(self, w: float = 2.0, decay: float = 1.0) -> None:
        if not 0 < decay <= 1:
            raise ValueError("decay must be in (0, 1]")
        self.w = w
        self._log2_decay = math.log2(decay)
        self._beta = 1.0 - w * self._log2_decay  # age weight once decay is folded in
        self._n_layer = 0
        self._opp: list[int] = []  # runs of each layer so far
        self._cur = 0
        self._last: dict[Key, int] = {}
        self._log2c: dict[Key, float] = {}
        self._heaps: list[_LazyMinHeap] = []
        self._head: list[tuple[float, Key] | None] = []  # cached unprotected head per layer
        self._dirty: set[int] = set()
        self._tie = 0

    def bind(self, budget_bytes: int, expert_bytes: Sequence[int]) -> None:
        self._n_layer = len(expert_bytes)
        self._opp = [0] * self._n_layer
        self._heaps = [_LazyMinHeap() for _ in expert_bytes]
        self._head = [None] * self._n_layer

    def on_batch(self, layer: int, now: int) -> None:
        self._cur = layer
        self._opp[layer] += 1

    def _count_use(self, key: Key) -> None:
        opp = self._opp[key[0]]
        last = self._last.get(key)
        if last is None:
            c = 1.0
        else:
            c = 2.0 ** (self._log2c[key] + (opp - last) * self._log2_decay) + 1.0
        self._last[key] = opp
        self._log2c[key] = math.log2(c)

    def _push(self, key: Key) -> None:
        self._tie += 1
        k = self._beta * self._last[key] + self.w * self._log2c[key]
        self._heaps[key[0]].set(key, k, self._tie)
        self._dirty.add(key[0])

    def on_hit(self, key: Key, now: int) -> None:
        self._count_use(key)
        self._push(key)

    on_insert = on_hit

    def on_promote(self, key: Key, now: int) -> None:
        self._log2c[key] = math.log2(2.0 ** self._log2c[key] + 1.0)
        self._push(key)

    def on_evict(self, key: Key) -> None:
        self._heaps[key[0]].discard(key)
        self._dirty.add(key[0])

    def victim(self, protected: set[Key]) -> Key | None:
        beta = self._beta
        return _phase_victim(self._heaps, self._head, self._dirty, self._cur, protected,
                             [beta * o for o in self._opp], 1.0)


class AgedDecay(Aged):
    """`aged` with frequency decay: counts fade by half every ~14 missed opportunities."""

    name = "aged-decay"

    def __init__(self) -> None:
        super().__init__(w=3.0, decay=0.95)


class AgedMarkov(Aged):
    """`aged` plus an online next-token predictor per layer (own design).

    Consecutive tokens route alike, and not only to the same experts: per layer it learns how often
    expert b is used at the next token when a was used now (transition counts, decode batches only).
    Right after layer L's batch, the experts of L's next run are predicted as the mean over the
    batch's experts a of P(b | a), smoothed toward b's marginal rate q(b) with `m` pseudo-counts; each
    resident entry of L then gets z * log2(P / q) opportunities of extra (or less) life. Cost: one
    numpy pass over L's experts and a re-push of L's resident entries per layer batch.
    """

    name = "aged-markov"

    def __init__(self, w: float = 2.0, decay: float = 1.0, z: float = 3.0, m: float = 4.0) -> None:
        super().__init__(w, decay)
        self.z, self.m = z, m
        self._bonus: dict[Key, float] = {}
        self._open = -1  # layer whose batch is being looked up (closed at victim or next on_batch)
        self._batch: list[int] = []
        self._batch_occ: dict[int, int] = {}  # occurrences in this batch (prefill: one per prompt token)

    def bind(self, budget_bytes: int, expert_bytes: Sequence[int]) -> None:
        super().bind(budget_bytes, expert_bytes)
        n = len(expert_bytes)
        f32 = np.float32  # counts: exact up to 2**24
        self._tr = [np.zeros((0, 0), f32) for _ in range(n)]  # transition counts a -> b, grown on demand
        self._src = [np.zeros(0, f32) for _ in range(n)]  # times a was followed by a decode batch
        self._occ = [np.zeros(0, f32) for _ in range(n)]  # uses of each expert (prefill tokens included)
        self._tokens = [0.0] * n
        self._prev: list[list[int] | None] = [None] * n
        self._res: list[set[Key]] = [set() for _ in range(n)]

    def _grow(self, layer: int, e: int) -> None:
        size = self._src[layer].shape[0]
        if e < size:
            return
        new = max(e + 1, 2 * size, 8)
        self._tr[layer] = np.pad(self._tr[layer], ((0, new - size), (0, new - size)))
        self._src[layer] = np.pad(self._src[layer], (0, new - size))
        self._occ[layer] = np.pad(self._occ[layer], (0, new - size))

    def _close(self) -> None:
        layer, batch, batch_occ = self._open, self._batch, self._batch_occ
        self._open, self._batch, self._batch_occ = -1, [], {}
        if layer < 0 or not batch:
            return
        occ = self._occ[layer]
        for e, c in batch_occ.items():
            occ[e] += c
        if max(batch_occ.values()) > 1:  # a prefill batch: a union of tokens, no transitions
            self._tokens[layer] += max(batch_occ.values())
            self._prev[layer] = None
        else:
            self._tokens[layer] += 1
            prev = self._prev[layer]
            if prev is not None:
                for a in prev:
                    self._tr[layer][a, batch] += 1
                self._src[layer][prev] += 1
            self._prev[layer] = batch
        prev = self._prev[layer]
        if prev is None:
            lr = np.zeros(occ.shape[0])
        else:
            q = (occ + 0.5) / (self._tokens[layer] + 0.5 * occ.shape[0] / len(batch))
            p = ((self._tr[layer][prev] + self.m * q) / (self._src[layer][prev][:, None] + self.m)).mean(0)
            lr = np.log2(p / q)
        for key in self._res[layer]:
            self._bonus[key] = self.z * float(lr[key[1]])
            self._push(key)

    def _push(self, key: Key) -> None:
        self._tie += 1
        k = self._beta * self._last[key] + self.w * self._log2c[key] + self._bonus.get(key, 0.0)
        self._heaps[key[0]].set(key, k, self._tie)
        self._dirty.add(key[0])

    def on_batch(self, layer: int, now: int) -> None:
        self._close()
        super().on_batch(layer, now)
        self._open = layer

    def _seen(self, key: Key) -> None:
        self._grow(*key)
        if key[0] == self._open:  # not a preload (ExpertCache.preload inserts outside any batch)
            self._batch.append(key[1])
            self._batch_occ[key[1]] = 1

    def on_hit(self, key: Key, now: int) -> None:
        self._seen(key)
        super().on_hit(key, now)

    def on_insert(self, key: Key, now: int) -> None:
        self._res[key[0]].add(key)
        self._seen(key)
        super().on_hit(key, now)

    def on_promote(self, key: Key, now: int) -> None:
        if key[0] == self._open:
            self._batch_occ[key[1]] = self._batch_occ.get(key[1], 1) + 1
        super().on_promote(key, now)

    def on_evict(self, key: Key) -> None:
        self._res[key[0]].discard(key)
        self._bonus.pop(key, None)
        super().on_evict(key)

    def victim(self, protected: set[Key]) -> Key | None:
        if self._open >= 0:
            self._close()
        return super().victim(protected)


class MarkovDuel(Policy):
    """Next-token use prediction per entry, with its aging rate picked online by duelling (own design).

    After each batch of layer L every expert b of L gets a score (a log-odds-like estimate that b is
    used at L's next run), from fixed weights over: used now; log2(1 + tokens since last use); log2 of
    b's smoothed use rate q(b) (prefill tokens count); the Markov ratio log2(P(b | now) / q(b)) of
    `aged-markov` (transition counts, decode only) - less `age` x tokens since last use. How fast
    stale entries should lose value differs between models and prompts, so several `ages` are scored
    side by side: each predicts L's next batch as its top `slots` experts (slots = budget / sum of
    per-layer expert bytes, the entries one layer gets on average) and counts the hits; the candidate
    with the most (slowly decayed) hits sets the scores. The victim is the lowest-scored unprotected
    entry, less `phase` x (layer steps until its layer runs again) / n_layer (so a tie goes to the
    layer that runs last, as in `aged`). Per layer batch: a few numpy passes over the layer's experts
    and a re-push of its resident entries; `victim` compares one cached head per layer.
    """

    name = "markov-duel"
    # bias, used now, log2(1 + tokens since last use), log2 q, Markov log-ratio
    WEIGHTS = (-3.0, 2.0, -0.5, 1.0, 1.0)

    def __init__(self, ages: Sequence[float] = (0.0, 0.05, 0.15, 0.4), phase: float = 1.0,
                 m: float = 4.0, score_decay: float = 0.999) -> None:
        self.ages = np.asarray(ages, dtype=np.float64)
        self.phase, self.m, self.score_decay = phase, m, score_decay
        self._w = np.asarray(self.WEIGHTS, dtype=np.float64)
        self._duel = np.zeros(len(self.ages))
        self._n = 0
        self._slots = 1.0
        self._open = -1
        self._cur = 0
        self._batch: list[int] = []
        self._occb: dict[int, int] = {}
        self._tie = 0

    def bind(self, budget_bytes: int, expert_bytes: Sequence[int]) -> None:
        n = self._n = len(expert_bytes)
        self._slots = budget_bytes / max(1, sum(expert_bytes))
        f32 = np.float32
        self._tr = [np.zeros((0, 0), f32) for _ in range(n)]  # transition counts a -> b
        self._src = [np.zeros(0, f32) for _ in range(n)]  # times a was followed by a decode batch
        self._occ = [np.zeros(0, f32) for _ in range(n)]  # uses (prefill tokens included)
        self._last = [np.zeros(0) for _ in range(n)]  # token (per layer) of the last use
        self._tokens = [0.0] * n
        self._prev: list[list[int] | None] = [None] * n
        self._pred: list[np.ndarray | None] = [None] * n  # each candidate's scores for the next batch
        self._score: list[np.ndarray | None] = [None] * n  # the chosen candidate's
        self._res: list[set[int]] = [set() for _ in range(n)]
        self._heaps = [_LazyMinHeap() for _ in range(n)]
        self._head: list[tuple[float, Key] | None] = [None] * n
        self._dirty: set[int] = set()
        self._zero = [0.0] * n  # no per-layer term in the victim rule

    def _grow(self, layer: int, e: int) -> None:
        size = self._src[layer].shape[0]
        if e < size:
            return
        new = max(e + 1, 2 * size, 8)
        d = new - size
        self._tr[layer] = np.pad(self._tr[layer], ((0, d), (0, d)))
        self._src[layer] = np.pad(self._src[layer], (0, d))
        self._occ[layer] = np.pad(self._occ[layer], (0, d))
        self._last[layer] = np.pad(self._last[layer], (0, d), constant_values=-1e9)

    def on_batch(self, layer: int, now: int) -> None:
        self._close()
        self._cur = layer
        self._open = layer

    def _close(self) -> None:
        layer, batch, occb = self._open, self._batch, self._occb
        self._open, self._batch, self._occb = -1, [], {}
        if layer < 0 or not batch:
            return
        occ = self._occ[layer]
        ntok = max(occb.values())
        prefill = ntok > 1  # a union of prompt tokens: no transitions, no duel
        pred = self._pred[layer]
        if not prefill and pred is not None:
            n0 = pred.shape[1]
            k = int(min(max(1, round(self._slots)), n0 - 1))
            top = np.argpartition(-pred, k - 1, axis=1)[:, :k]
            used = np.zeros(n0, bool)
            used[[e for e in batch if e < n0]] = True
            self._duel = self.score_decay * self._duel + used[top].sum(1)
        for e, c in occb.items():
            occ[e] += c
        tok = self._tokens[layer] + ntok
        self._tokens[layer] = tok
        last = self._last[layer]
        last[batch] = tok
        if prefill:
            self._prev[layer] = None
        else:
            prev = self._prev[layer]
            if prev is not None:
                for a in prev:
                    self._tr[layer][a, batch] += 1
                self._src[layer][prev] += 1
            self._prev[layer] = batch
        q = self._rate(layer, occ, tok, len(batch))
        w = self._w
        since = np.minimum(tok - last, 1e4)
        base = w[0] + w[2] * np.log2(1.0 + np.minimum(since, 63.0)) + w[3] * np.log2(q)
        if not prefill:
            base[batch] += w[1]
        prev = self._prev[layer]
        if prev is not None:
            p = ((self._tr[layer][prev] + self.m * q) / (self._src[layer][prev][:, None] + self.m)).mean(0)
            base += w[4] * np.log2(p / q)
        cands = base[None, :] - self.ages[:, None] * since[None, :]
        self._pred[layer] = cands
        score = self._adjust(layer, cands[int(np.argmax(self._duel))])
        self._score[layer] = score
        heap = self._heaps[layer]
        for e in self._res[layer]:
            self._tie += 1
            heap.set((layer, e), float(score[e]), self._tie)
        self._dirty.add(layer)

    def _rate(self, layer: int, occ: np.ndarray, tok: float, k: int) -> np.ndarray:
        """q(b): each expert's smoothed use rate so far (uses / tokens, prefill tokens counted), for
        the experts of `layer` seen so far (len(occ) of them); k is this batch's size."""
        return (occ + 0.5) / (tok + 0.5 * occ.shape[0] / k)

    def _adjust(self, layer: int, score: np.ndarray) -> np.ndarray:
        """The scores `layer`'s resident entries get after its batch (a seam for the informed bounds
        of harness/replay/bounds.py; online, unchanged)."""
        return score

    def _seen(self, key: Key) -> None:
        self._grow(*key)
        if key[0] == self._open:
            self._batch.append(key[1])
            self._occb[key[1]] = 1

    def on_hit(self, key: Key, now: int) -> None:
        self._seen(key)

    def on_insert(self, key: Key, now: int) -> None:
        self._res[key[0]].add(key[1])
        self._seen(key)
        if key[0] != self._open:  # a preload (outside any batch): the layer's current score, else 0
            score = self._score[key[0]]
            self._tie += 1
            s = float(score[key[1]]) if score is not None and key[1] < score.shape[0] else 0.0
            self._heaps[key[0]].set(key, s, self._tie)
            self._dirty.add(key[0])

    def on_promote(self, key: Key, now: int) -> None:
        if key[0] == self._open:
            self._occb[key[1]] = self._occb.get(key[1], 1) + 1

    def on_evict(self, key: Key) -> None:
        self._res[key[0]].discard(key[1])
        self._heaps[key[0]].discard(key)
        self._dirty.add(key[0])

    def victim(self, protected: set[Key]) -> Key | None:
        if self._open >= 0:
            self._close()
        return _phase_victim(self._heaps, self._head, self._dirty, self._cur, protected, self._zero, self.phase)


class Belady(Policy):
    """Belady's MIN, the offline optimum: evict the resident entry whose next use is farthest in the
    future (never used again first). Needs the whole lookup sequence up front (`prepare_offline`), so
    it is replay-only. All entries of a layer have the same size; across layers sizes may differ, where
    farthest-next-use is the standard rule (exactly optimal only for equal sizes)."""

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

ONLINE_DEFAULT = "aged-markov"  # wins on both shared traces at every budget (bench-data/2026-11-30-cache-replay)


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
