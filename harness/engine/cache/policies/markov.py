"""The online routing model behind `aged-markov` and `markov-duel`: per layer, what the layer's batches
so far say about which experts its next batch will use."""

from __future__ import annotations

from types import ModuleType

import numpy as np

from harness.engine.cache.policies.base import Key


def use_rate(occ: np.ndarray, tokens: float, k: int) -> np.ndarray:
    """q(b): each expert's smoothed use rate (uses / tokens, prefill tokens counted) over the experts
    seen so far (len(occ) of them); k is the current batch's size."""
    return (occ + 0.5) / (tokens + 0.5 * occ.shape[0] / k)


class MarkovModel:
    """Learnt online from one layer batch at a time, per layer: each expert's uses (a prompt token's
    use is a use), the tokens seen, the token of each expert's last use, and transition counts a -> b
    between consecutive decode batches (a used at one token, b at the next). Arrays grow on demand up
    to the highest expert seen (float32 counts: exact up to 2**24).

    A batch is collected while the cache looks it up (`start`, `see`, `promote`) and learnt when it
    closes (`close`). A batch where an expert occurs more than once is a prefill batch (the union of
    the prompt tokens' experts): it counts as that many tokens and breaks the transition chain.

    With `compiled` (harness.engine.cache.policies.native.helper()) the count updates and the arithmetic
    before each log2 run in C, on the same arrays, to the same bits; the numpy code is the reference."""

    def __init__(self, n_layer: int, m: float, compiled: ModuleType | None = None) -> None:
        self.m = m  # pseudo-counts smoothing P(b | a) toward q(b)
        self.c = compiled
        f32 = np.float32
        self.tr = [np.zeros((0, 0), f32) for _ in range(n_layer)]  # transition counts a -> b
        self.src = [np.zeros(0, f32) for _ in range(n_layer)]  # times a was followed by a decode batch
        self.occ = [np.zeros(0, f32) for _ in range(n_layer)]  # uses (prefill tokens included)
        self.last = [np.zeros(0) for _ in range(n_layer)]  # token (per layer) of the last use
        self.tokens = [0.0] * n_layer
        self.prev: list[list[int] | None] = [None] * n_layer  # the last decode batch (None after prefill)
        self.prev_idx: list[np.ndarray] = [np.zeros(0, np.intp)] * n_layer  # prev as an index array (decode)
        self.open = -1  # layer whose batch is being looked up (-1: none)
        self.batch: list[int] = []  # its experts, in lookup order
        self.batch_occ: dict[int, int] = {}  # their occurrences (prefill: one per prompt token)
        # the batches' experts as the lists themselves, not intp arrays (the compiled helper takes either):
        # for a caller whose every reader of prev_idx is compiled
        self.idx_lists = False
        self._bufs: list[tuple[np.ndarray, np.ndarray] | None] = [None] * n_layer  # rate_and_log_ratio's, compiled

    def _grow(self, layer: int, e: int) -> None:
        size = self.src[layer].shape[0]
        if e < size:
            return
        self.fit(layer, max(e + 1, 2 * size, 8))

    def fit(self, layer: int, new: int) -> None:
        """Grow `layer`'s arrays to `new` experts (zeros; last use -1e9): one pad or several, the same
        arrays. A caller that sizes them by `_grow`'s rule elsewhere (the compiled aged core) fits
        them before a close."""
        size = self.src[layer].shape[0]
        if new <= size:
            return
        d = new - size
        self.tr[layer] = np.pad(self.tr[layer], ((0, d), (0, d)))
        self.src[layer] = np.pad(self.src[layer], (0, d))
        self.occ[layer] = np.pad(self.occ[layer], (0, d))
        self.last[layer] = np.pad(self.last[layer], (0, d), constant_values=-1e9)

    def start(self, layer: int) -> None:
        """A batch of `layer` begins (the previous one must be closed first)."""
        self.open = layer

    def see(self, key: Key) -> None:
        """A lookup (hit or insert); one outside the open batch (a preload) only sizes the arrays."""
        self._grow(*key)
        if key[0] == self.open:
            self.batch.append(key[1])
            self.batch_occ[key[1]] = 1

    def promote(self, key: Key) -> None:
        """A duplicate in the open batch: one more prompt token routed to the expert."""
        if key[0] == self.open:
            self.batch_occ[key[1]] = self.batch_occ.get(key[1], 1) + 1

    def close(self) -> tuple[int, list[int], int] | None:
        """Learn the open batch: (layer, its experts, the tokens it counts as), or None when there
        was none (or it was empty)."""
        layer, batch, batch_occ = self.open, self.batch, self.batch_occ
        self.open, self.batch, self.batch_occ = -1, [], {}
        if layer < 0 or not batch:
            return None
        return self.learn(layer, batch, batch_occ)

    def learn(self, layer: int, batch: list[int], batch_occ: dict[int, int]) -> tuple[int, list[int], int]:
        """`close` of a batch collected elsewhere (batch: its experts in lookup order, batch_occ: their
        occurrences; not empty)."""
        idx = batch if self.idx_lists else np.array(batch, np.intp)  # batch_occ's keys, in the same order
        ntok = max(batch_occ.values())
        tok = self.tokens[layer] + ntok
        self.tokens[layer] = tok
        chain = ntok == 1 and self.prev[layer] is not None
        if self.c is not None:
            self.c.learn(self.tr[layer], self.src[layer], self.occ[layer], self.last[layer], idx,
                         None if ntok == 1 else np.array(list(batch_occ.values()), np.intp), tok,
                         self.prev_idx[layer] if chain else None)
        else:
            self.occ[layer][idx] += 1 if ntok == 1 else np.array(list(batch_occ.values()))  # unique: one add each
            self.last[layer][idx] = tok
            if chain:
                pidx = self.prev_idx[layer]
                self.tr[layer][pidx[:, None], idx] += 1  # unique rows and columns: one add each
                self.src[layer][pidx] += 1
        if ntok > 1:  # prefill: no transitions
            self.prev[layer] = None
        else:
            self.prev[layer] = batch
            self.prev_idx[layer] = idx
        return layer, batch, ntok

    def rate(self, layer: int, k: int) -> np.ndarray:
        """q(b) for `layer` (see `use_rate`)."""
        return use_rate(self.occ[layer], self.tokens[layer], k)

    def log_ratio(self, layer: int, q: np.ndarray) -> np.ndarray | None:
        """log2(P(b | last batch) / q(b)) for each expert b of `layer`: P is the mean over the last
        decode batch's experts a of P(b | a), smoothed toward q with `m` pseudo-counts. None after a
        prefill batch (no last decode batch)."""
        prev = self.prev[layer]
        if prev is None:
            return None
        pidx = self.prev_idx[layer]
        x = (self.tr[layer][pidx] + self.m * q) / (self.src[layer][pidx][:, None] + self.m)
        # the mean over rows as ndarray.mean computes it (its sum, then a division by the intp count), bit for bit
        p = np.add.reduce(x, axis=0)
        np.true_divide(p, np.intp(x.shape[0]), out=p, casting="unsafe")
        return np.log2(p / q)

    def rate_and_log_ratio(self, layer: int, k: int) -> tuple[np.ndarray, np.ndarray | None]:
        """(`rate(layer, k)`, `log_ratio(layer, that rate)`), the same bits; in C when compiled (then into the
        layer's reused buffers: valid until the layer's next call)."""
        c = self.c
        if c is None:
            q = self.rate(layer, k)
            return q, self.log_ratio(layer, q)
        size = self.src[layer].shape[0]
        buf = self._bufs[layer]
        if buf is None or buf[0].shape[0] != size:
            buf = self._bufs[layer] = (np.empty(size, np.float32), np.empty(size, np.float32))
        q, r = buf[0], None if self.prev[layer] is None else buf[1]
        c.ratio(self.tr[layer], self.src[layer], self.occ[layer], self.tokens[layer], k, self.m,
                None if r is None else self.prev_idx[layer], q, r)
        if r is not None:
            np.log2(r, out=r)  # numpy's log2 (its SIMD one is not libm's, bit for bit)
        return q, r
