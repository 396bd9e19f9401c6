"""Phase-aware, frequency-protected recency: `aged`, `aged-decay` and `aged-markov` (own designs,
aimed at sequential flooding)."""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence

from harness.engine.cache.policies import native
from harness.engine.cache.policies.base import Key, Policy
from harness.engine.cache.policies.heaps import LayerHeaps
from harness.engine.cache.policies.markov import MarkovModel


class Aged(Policy):
    """Phase-aware, frequency-protected recency.

    Layers repeat in a fixed order, so an entry of layer L can next be used only when L comes round
    again. Age is counted in *opportunities* (runs of the entry's own layer since its last use), not
    in global lookups, and among equally aged entries the one whose layer comes round last is
    evicted (global LRU does the opposite: it evicts the layer about to run, hence 0% under T).
    Frequency buys time: each doubling of an entry's use count (prefill duplicates count: a prompt
    token's use is a use) is worth `w` opportunities of age. With `decay` < 1 the count is decayed by
    that factor per missed opportunity (frequency with decay).

    Evicts the entry maximising  age_opps + delta_L / n_layer - w * log2(count), where delta_L is the
    number of layer steps until L runs again. The per-entry part is time-invariant, so each layer
    keeps a lazy min-heap of it (LayerHeaps); `victim` re-reads only the heads that changed and
    compares one number per layer (O(n_layer) float compares + O(log n) heap work).
    """

    name = "aged"

    def __init__(self, w: float = 2.0, decay: float = 1.0) -> None:
        if not 0 < decay <= 1:
            raise ValueError("decay must be in (0, 1]")
        self.w = w
        self._log2_decay = math.log2(decay)
        self._beta = 1.0 - w * self._log2_decay  # age weight once decay is folded in
        self._opp: list[int] = []  # runs of each layer so far
        self._base: list[float] = []  # beta x runs of each layer: the victim rule's per-layer term
        self._cur = 0
        self._last: dict[Key, int] = {}
        self._log2c: dict[Key, float] = {}
        self._heaps = LayerHeaps(0)

    def bind(self, budget_bytes: int, expert_bytes: Sequence[int]) -> None:
        self._opp = [0] * len(expert_bytes)
        self._base = [0.0] * len(expert_bytes)
        self._heaps = native.layer_heaps(len(expert_bytes))
        c = native.helper()
        if c is not None and type(self) in (Aged, AgedDecay):
            self._take_core(c.AgedCore(len(expert_bytes), self.w, self._log2_decay, self._beta, False))

    def _take_core(self, core: object) -> None:
        """The compiled state (native.helper().AgedCore) takes every call the cache makes: the same
        arithmetic, in C; this object's Python state then stays unused."""
        self._core = core
        for name in ("on_batch", "on_hit", "on_insert", "on_promote", "on_evict", "victim"):
            setattr(self, name, getattr(core, name))

    def on_batch(self, layer: int, now: int) -> None:
        self._cur = layer
        self._opp[layer] += 1
        self._base[layer] = self._beta * self._opp[layer]

    def _count_use(self, key: Key) -> None:
        opp = self._opp[key[0]]
        last = self._last.get(key)
        if last is None:
            c = 1.0
        else:
            c = 2.0 ** (self._log2c[key] + (opp - last) * self._log2_decay) + 1.0
        self._last[key] = opp
        self._log2c[key] = math.log2(c)

    def _score(self, key: Key) -> float:
        """The time-invariant part of the entry's keep-score (higher: kept longer)."""
        return self._beta * self._last[key] + self.w * self._log2c[key]

    def _push(self, key: Key) -> None:
        self._heaps.push(key, self._score(key))

    def on_hit(self, key: Key, now: int) -> None:
        self._count_use(key)
        self._push(key)

    on_insert = on_hit

    def on_promote(self, key: Key, now: int) -> None:
        self._log2c[key] = math.log2(2.0 ** self._log2c[key] + 1.0)
        self._push(key)

    def on_evict(self, key: Key) -> None:
        self._heaps.discard(key)

    def victim(self, protected: set[Key]) -> Key | None:
        return self._heaps.victim(self._cur, protected, self._base, 1.0)


class AgedDecay(Aged):
    """`aged` with frequency decay: counts fade by half every ~14 missed opportunities."""

    name = "aged-decay"

    def __init__(self) -> None:
        super().__init__(w=3.0, decay=0.95)


class AgedMarkov(Aged):
    """`aged` plus the online next-token predictor of MarkovModel.

    Consecutive tokens route alike, and not only to the same experts: per layer the model learns how
    often expert b is used at the next token when a was used now (transition counts, decode batches
    only). Right after layer L's batch, the experts of L's next run are predicted as the mean over the
    batch's experts a of P(b | a), smoothed toward b's use rate q(b) with `m` pseudo-counts; each
    resident entry of L then gets z * log2(P / q) opportunities of extra (or less) life. Cost: one
    numpy pass over L's experts and a re-push of L's resident entries per layer batch.
    """

    name = "aged-markov"

    def __init__(self, w: float = 2.0, decay: float = 1.0, z: float = 3.0, m: float = 4.0) -> None:
        super().__init__(w, decay)
        self.z, self.m = z, m
        self._bonus: dict[Key, float] = {}
        self._model = MarkovModel(0, m)
        self._res: list[set[Key]] = []

    def bind(self, budget_bytes: int, expert_bytes: Sequence[int]) -> None:
        super().bind(budget_bytes, expert_bytes)
        n = len(expert_bytes)
        c = native.helper()
        self._model = MarkovModel(n, self.m, c)
        self._res = [set() for _ in range(n)]
        if c is not None and type(self) is AgedMarkov:
            ref = weakref.ref(self)  # the core calls back; a weak reference keeps no cycle

            def closer() -> None:
                me = ref()
                if me is not None:
                    me._close_core()

            self._take_core(c.AgedCore(n, self.w, self._log2_decay, self._beta, True, closer))
        self._model.idx_lists = c is not None  # its only reader is the compiled ratio

    def _close_core(self) -> None:
        """`_close` with the compiled core: it collected the batch and holds the scores."""
        core, model = self._core, self._model
        taken = core.take()
        if taken is None:
            return
        layer, batch, batch_occ = taken
        size = core.size(layer)
        if size > model.src[layer].shape[0]:
            model.fit(layer, size)
        model.learn(layer, batch, batch_occ)
        lr = None if model.prev[layer] is None else model.rate_and_log_ratio(layer, len(batch))[1]
        core.rescore(layer, lr, self.z)

    def _close(self) -> None:
        model = self._model
        closed = model.close()
        if closed is None:
            return
        layer, batch, _ = closed
        lr = None if model.prev[layer] is None else model.rate_and_log_ratio(layer, len(batch))[1]
        keys = list(self._res[layer])
        bonus = self._bonus
        if lr is None:
            for key in keys:
                bonus[key] = 0.0
        else:
            z, lrs = self.z, lr.tolist()
            for key in keys:
                bonus[key] = z * lrs[key[1]]
        beta, w, last, log2c = self._beta, self.w, self._last, self._log2c
        self._heaps.push_many(layer, keys, [beta * last[k] + w * log2c[k] + bonus[k] for k in keys])

    def _score(self, key: Key) -> float:
        return self._beta * self._last[key] + self.w * self._log2c[key] + self._bonus.get(key, 0.0)

    def on_batch(self, layer: int, now: int) -> None:
        self._close()
        super().on_batch(layer, now)
        self._model.start(layer)

    # Inside the open batch an entry's score is not pushed: the batch's close re-scores every resident
    # entry of its layer before any victim is asked for, so that push would be replaced unread (the ties
    # of the entries that stay keep their order, so the decisions are the same).
    def on_hit(self, key: Key, now: int) -> None:
        self._model.see(key)
        self._count_use(key)
        if key[0] != self._model.open:
            self._push(key)

    def on_insert(self, key: Key, now: int) -> None:
        self._res[key[0]].add(key)
        self.on_hit(key, now)  # the model sees it once, there

    def on_promote(self, key: Key, now: int) -> None:
        self._model.promote(key)
        self._log2c[key] = math.log2(2.0 ** self._log2c[key] + 1.0)
        if key[0] != self._model.open:
            self._push(key)

    def on_evict(self, key: Key) -> None:
        self._res[key[0]].discard(key)
        self._bonus.pop(key, None)
        super().on_evict(key)

    def victim(self, protected: set[Key]) -> Key | None:
        if self._model.open >= 0:
            self._close()
        return super().victim(protected)
