"""Informed bounds: how far an online policy could go if it knew more than the past.

Each bound is the engine's `markov-duel` (its features, weights and duel unchanged) *told* one piece of
the future by the trace, so the ladder isolates what information closes the LRU->Belady gap:

- `told-popularity`: every expert's run-long use rate (uses over the whole trace / all its tokens),
  known from the first token, in place of the rate seen so far;
- `told-next-token`: which of a layer's experts its next run will use (the next token's exact routing,
  every layer), as a large bonus on those entries' scores;
- `told-both`: the two together;
- `told-next-W` (W tokens): each expert's use rate over the layer's next W decode tokens in place of
  the rate seen so far (the local popularity Belady effectively exploits).

They are offline (replay only, like belady): the engine cannot select them. They run through the
engine's own ExpertCache, so the accounting is the engine's. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from harness.engine import MarkovDuel
from harness.replay.trace import RouteTrace

NEXT_TOKEN_BONUS = 8.0  # log2 units: far above every other feature's spread, so "used next" wins


class Usage:
    """A trace's routing as arrays: per layer, decode use (token x expert) and run-long use counts
    (a prompt token's use counts once per prompt token, as markov-duel counts it)."""

    def __init__(self, trace: RouteTrace):
        n, e, t = trace.n_layer, trace.n_expert, trace.decode_tokens
        self.decode = np.zeros((n, t, e), dtype=bool)
        self.total = np.zeros((n, e))
        for b in trace.batches:
            if b.token < 0:
                for x in b.experts:
                    self.total[b.layer, x] += 1
            else:
                self.decode[b.layer, b.token, list(b.unique)] = True
        self.total += self.decode.sum(1)
        self.tokens = trace.prefill_tokens + t
        self.n_decode = t


def _fit(v: np.ndarray, size: int) -> np.ndarray:
    """v cut or zero-padded to `size` (markov-duel grows its per-layer arrays on demand)."""
    return v[:size] if v.shape[0] >= size else np.pad(v, (0, size - v.shape[0]))


class _Told(MarkovDuel):
    offline = True
    tell_popularity = False
    tell_next_token = False
    window = 0  # > 0: tell the next `window` tokens' use rate

    def __init__(self, trace: RouteTrace, usage: Usage | None = None) -> None:
        super().__init__()
        self._u = usage or Usage(trace)
        self._batches = trace.batches
        self._pos = 0
        self._token = -1
        self._done = [0] * trace.n_layer  # decode runs of each layer closed so far

    def on_batch(self, layer: int, now: int) -> None:
        super().on_batch(layer, now)  # closes the previous batch first
        if self._pos >= len(self._batches) or self._batches[self._pos].layer != layer:
            raise RuntimeError(f"{self.name}: batch {self._pos} is layer {layer}, not the trace's")
        self._token = self._batches[self._pos].token
        self._pos += 1

    def _close(self) -> None:
        m = self._model
        if m.open >= 0 and m.batch and self._token >= 0:
            self._done[m.open] += 1
        super()._close()

    def _rate(self, layer: int, occ: np.ndarray, tok: float, k: int) -> np.ndarray:
        u, size = self._u, occ.shape[0]
        if self.window:
            lo = self._done[layer]  # the layer's next decode token
            hi = min(u.n_decode, lo + self.window)
            used = _fit(u.decode[layer, lo:hi].sum(0).astype(float), size)
            return (used + 0.5) / (hi - lo + 0.5 * size / k)
        if self.tell_popularity:
            return (_fit(u.total[layer], size) + 0.5) / (u.tokens + 0.5 * size / k)
        return super()._rate(layer, occ, tok, k)

    def _adjust(self, layer: int, score: np.ndarray) -> np.ndarray:
        nxt = self._done[layer]
        if not self.tell_next_token or nxt >= self._u.n_decode:
            return score
        return score + NEXT_TOKEN_BONUS * _fit(self._u.decode[layer, nxt].astype(float), score.shape[0])


class ToldPopularity(_Told):
    name = "told-popularity"
    tell_popularity = True


class ToldNextToken(_Told):
    name = "told-next-token"
    tell_next_token = True


class ToldBoth(_Told):
    name = "told-both"
    tell_popularity = True
    tell_next_token = True


def told_window(w: int) -> type[_Told]:
    return type(f"ToldNext{w}", (_Told,), {"name": f"told-next-{w}", "window": w})


BOUNDS: dict[str, type[_Told]] = {
    c.name: c for c in (ToldPopularity, ToldNextToken, ToldBoth, told_window(64), told_window(16))
}
TOLD_WHAT = {
    "told-popularity": "every expert's run-long use rate, from the first token",
    "told-next-token": "the next token's exact routing, every layer",
    "told-both": "both of the above",
    "told-next-64": "each expert's use rate over the next 64 tokens",
    "told-next-16": "each expert's use rate over the next 16 tokens",
}


def make_bound(name: str, trace: RouteTrace, usage: Usage | None = None) -> _Told:
    if name not in BOUNDS:
        raise KeyError(name)
    return BOUNDS[name](trace, usage)


def bound_names() -> Sequence[str]:
    return list(BOUNDS)


