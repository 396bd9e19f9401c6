"""`markov-duel`: next-token use prediction per entry, its aging rate picked online by duelling (own
design)."""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import numpy as np

from harness.engine.cache.policies import native
from harness.engine.cache.policies.base import Key, Policy
from harness.engine.cache.policies.heaps import LayerHeaps
from harness.engine.cache.policies.markov import MarkovModel, use_rate


class MarkovDuel(Policy):
    """Next-token use prediction per entry, with its aging rate picked online by duelling.

    After each batch of layer L every expert b of L gets a score (a log-odds-like estimate that b is
    used at L's next run), from fixed weights over: used now; log2(1 + tokens since last use); log2 of
    b's smoothed use rate q(b) (prefill tokens count); the Markov ratio log2(P(b | now) / q(b)) of
    MarkovModel (the one `aged-markov` uses) - less `age` x tokens since last use. How fast stale
    entries should lose value differs between models and prompts, so several `ages` are scored side by
    side: each predicts L's next batch as its top `slots` experts (slots = budget / sum of per-layer
    expert bytes, the entries one layer gets on average) and counts the hits; the candidate with the
    most (slowly decayed) hits sets the scores. The victim is the lowest-scored unprotected entry, less
    `phase` x (layer steps until its layer runs again) / n_layer (so a tie goes to the layer that runs
    last, as in `aged`). Per layer batch: a few numpy passes over the layer's experts and a re-push of
    its resident entries; `victim` compares one cached head per layer.

    Two seams let the informed bounds of the replay (harness/replay/bounds.py) tell it part of the
    future: `_rate` (the use rate q) and `_adjust` (the scores after a batch).
    """

    name = "markov-duel"
    # bias, used now, log2(1 + tokens since last use), log2 q, Markov log-ratio
    WEIGHTS = (-3.0, 2.0, -0.5, 1.0, 1.0)

    def __init__(self, ages: Sequence[float] = (0.0, 0.05, 0.15, 0.4), phase: float = 1.0,
                 m: float = 4.0, score_decay: float = 0.999) -> None:
        self.ages = np.asarray(ages, dtype=np.float64)
        self._ages_col = self.ages[:, None]
        self.phase, self.m, self.score_decay = phase, m, score_decay
        self._w = np.asarray(self.WEIGHTS, dtype=np.float64)
        self._duel = np.zeros(len(self.ages))  # each candidate's decayed prediction hits
        self._slots = 1.0
        self._cur = 0
        self._model = MarkovModel(0, m)
        self._heaps = LayerHeaps(0)

    def bind(self, budget_bytes: int, expert_bytes: Sequence[int]) -> None:
        n = len(expert_bytes)
        self._slots = budget_bytes / max(1, sum(expert_bytes))
        self._model = MarkovModel(n, self.m, native.helper())
        # the compiled scores only where `_rate` and `_adjust` are the online ones (the informed bounds
        # of the replay override them and take the numpy path)
        cls = type(self)
        self._c = self._model.c if (cls._rate, cls._adjust) == (MarkovDuel._rate, MarkovDuel._adjust) else None
        self._wt = tuple(float(x) for x in self._w)
        self._pred: list[np.ndarray | None] = [None] * n  # each candidate's scores for the next batch
        self._score: list[np.ndarray | None] = [None] * n  # the chosen candidate's
        self._res: list[set[int]] = [set() for _ in range(n)]
        self._heaps = native.layer_heaps(n)
        self._zero = [0.0] * n  # no per-layer term in the victim rule
        self._bufs: list[tuple | None] = [None] * n  # the compiled close's per-layer buffers
        self._log2tab = np.log2(np.arange(1.0, 65.0))  # numpy's log2 of each staleness argument, 1..64
        self._kslots = max(1, round(self._slots))  # the duel's top-k, before the cap at the layer's size - 1
        self._model.idx_lists = self._c is not None  # then every reader of the batches' experts is compiled
        self._core = None
        if self._c is not None and cls is MarkovDuel:
            ref = weakref.ref(self)  # the core calls back; a weak reference keeps no cycle

            def closer() -> None:
                me = ref()
                if me is not None:
                    me._close_core()

            def preload(key: Key) -> None:
                me = ref()
                if me is not None:
                    me._push_current(key)

            core = self._core = self._c.AgedCore(n, 0.0, 0.0, 0.0, True, closer, True, self.phase, preload)
            self._heaps, self._res = core.heaps, core.res
            for name in ("on_batch", "on_hit", "on_insert", "on_promote", "on_evict", "victim"):
                setattr(self, name, getattr(core, name))  # the cache's calls go straight to the core

    def on_batch(self, layer: int, now: int) -> None:
        self._close()
        self._cur = layer
        self._model.start(layer)

    def _duel_step(self, layer: int, batch: list[int]) -> None:
        """Score each candidate's prediction for this decode batch (its top `slots` experts)."""
        pred = self._pred[layer]
        if pred is None:
            return
        n0 = pred.shape[1]
        k = int(min(max(1, round(self._slots)), n0 - 1))
        idx = self._model.prev_idx[layer]  # this decode batch's experts
        c = self._model.c
        if c is not None and c.duel_step(pred, idx, k, self.score_decay, self._duel):
            return  # the same counts (False: a tie argpartition breaks its own way; then numpy's)
        idx = np.asarray(idx, np.intp)  # a list where every other reader is compiled (MarkovModel.idx_lists)
        top = np.argpartition(-pred, k - 1, axis=1)[:, :k]
        used = np.zeros(n0, bool)
        used[idx[idx < n0]] = True
        self._duel = self.score_decay * self._duel + used[top].sum(1)

    def _close(self) -> None:
        model = self._model
        closed = model.close() if self._core is None else self._take()
        if closed is None:
            return
        layer, batch, ntok = closed
        prefill = ntok > 1  # a union of prompt tokens: no transitions, no duel
        if self._c is not None:
            self._close_compiled(layer, batch, prefill)  # its duel step too
            return
        if not prefill:
            self._duel_step(layer, batch)
        tok = model.tokens[layer]
        q = self._rate(layer, model.occ[layer], tok, len(batch))
        w = self._w
        since = np.minimum(tok - model.last[layer], 1e4)
        base = w[0] + w[2] * np.log2(1.0 + np.minimum(since, 63.0)) + w[3] * np.log2(q)
        if not prefill:
            base[model.prev_idx[layer]] += w[1]  # the batch's experts (unique)
        lr = model.log_ratio(layer, q)
        if lr is not None:
            base += w[4] * lr
        cands = base[None, :] - self._ages_col * since[None, :]
        self._pred[layer] = cands
        score = self._adjust(layer, cands[int(np.argmax(self._duel))])
        self._score[layer] = score
        es = list(self._res[layer])
        self._heaps.push_many(layer, [(layer, e) for e in es], score[es].tolist())

    def _close_core(self) -> None:
        """`_close` with the compiled core and scores (the core calls it): `_take`, then `_close_compiled`
        (the duel step included), in fewer frames."""
        taken = self._core.take()
        if taken is None:
            return
        layer, batch, batch_occ = taken
        model = self._model
        size = self._core.size(layer)
        if size > model.src[layer].shape[0]:
            model.fit(layer, size)
        self._close_compiled(layer, batch, model.learn(layer, batch, batch_occ)[2] > 1)

    def _take(self) -> tuple[int, list[int], int] | None:
        """`MarkovModel.close` of the batch the compiled core collected."""
        taken = self._core.take()
        if taken is None:
            return None
        layer, batch, batch_occ = taken
        size = self._core.size(layer)
        if size > self._model.src[layer].shape[0]:
            self._model.fit(layer, size)
        return self._model.learn(layer, batch, batch_occ)

    def _close_compiled(self, layer: int, batch: list[int], prefill: bool) -> None:
        """`_close`'s scores (after its duel step) in C, the log2s in numpy: the same bits. One numpy log2 over
        q and P / q side by side in one float32 buffer (elementwise: each value's bits do not depend on its
        place, tests/engine/test_policy_impls.py), the staleness's log2 from a table of numpy's log2 of 1..64 (the
        only values its argument takes); per-layer buffers reused (a batch's candidates are read only by the
        layer's next duel step, before they are overwritten)."""
        model, c = self._model, self._c
        size = model.src[layer].shape[0]
        buf = self._bufs[layer]
        if buf is None or buf[3].shape[1] != size:
            qr = np.empty(2 * size, np.float32)
            cands = np.empty((len(self.ages), size))
            buf = self._bufs[layer] = (qr, qr[:size], qr[size:], cands, list(cands))
        qr, q, r, cands, rows = buf
        chain = model.prev[layer] is not None
        c.ratio(model.tr[layer], model.src[layer], model.occ[layer], model.tokens[layer], len(batch), model.m,
                model.prev_idx[layer] if chain else None, q, r)
        if chain:
            np.log2(qr, out=qr)
        else:
            np.log2(q, out=q)
        idx, pred = model.prev_idx[layer], None if prefill else self._pred[layer]
        rest = (q, r if chain else None, model.last[layer], model.tokens[layer], self._log2tab,
                None if prefill else idx, self._wt, self.ages, cands)
        row = c.duel_close(pred, idx, self._kslots, self.score_decay, *rest, self._duel, self._heaps, layer,
                           self._res[layer])  # the duel step first
        if row == -2:  # the duel step met a tie: numpy's (a new self._duel), then the rest
            self._duel_step(layer, batch)
            row = c.duel_close(None, idx, self._kslots, self.score_decay, *rest, self._duel, self._heaps, layer,
                               self._res[layer])
        if row < 0:  # a staleness the table does not hold (cannot happen with whole token counts): numpy's log2
            since, arg = np.empty(size), np.empty(size)
            c.since(model.last[layer], model.tokens[layer], since, arg)
            es = list(self._res[layer])
            duel = self._duel.tolist()
            row = duel.index(max(duel))
            scores = c.duel_scores(q, np.log2(arg), r if chain else None, since,
                                   None if prefill else model.prev_idx[layer], self._wt, self.ages, cands, row, es)
            self._heaps.push_many(layer, [(layer, e) for e in es], scores)
        self._pred[layer] = cands
        self._score[layer] = rows[row]

    def _rate(self, layer: int, occ: np.ndarray, tok: float, k: int) -> np.ndarray:
        """q(b) for `layer` after its batch (occ: uses so far, tok: tokens so far, k: the batch's
        size); online, `use_rate`."""
        return use_rate(occ, tok, k)

    def _adjust(self, layer: int, score: np.ndarray) -> np.ndarray:
        """The scores `layer`'s resident entries get after its batch; online, unchanged."""
        return score

    def on_hit(self, key: Key, now: int) -> None:
        self._model.see(key)

    def on_insert(self, key: Key, now: int) -> None:
        self._res[key[0]].add(key[1])
        self._model.see(key)
        if key[0] != self._model.open:  # a preload (outside any batch): the layer's current score, else 0
            self._push_current(key)

    def _push_current(self, key: Key) -> None:
        score = self._score[key[0]]
        s = float(score[key[1]]) if score is not None and key[1] < score.shape[0] else 0.0
        self._heaps.push(key, s)

    def on_promote(self, key: Key, now: int) -> None:
        self._model.promote(key)

    def on_evict(self, key: Key) -> None:
        self._res[key[0]].discard(key[1])
        self._heaps.discard(key)

    def victim(self, protected: set[Key]) -> Key | None:
        if self._model.open >= 0:
            self._close()
        return self._heaps.victim(self._cur, protected, self._zero, self.phase)
