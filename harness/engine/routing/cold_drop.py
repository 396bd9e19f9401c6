"""Drop cold experts (`--drop-cold-experts F`): the pure decision and its application to one layer batch.

A routed expert is dropped only when it is a cache miss AND its share of the token's router weight (its
weight over the sum of the token's k weights) is below F x 1/k, the share of an even split. A dropped slot
contributes nothing: its weight is set to 0 in the layer's final weights tensor (the one the expert outputs
are multiplied by), and the kept weights are scaled so that the token's weights keep their sum
(renormalisation; `--drop-no-renorm` leaves them as they are). Its expert id is replaced by a kept expert's
of the same token, so the expert matmul computes from resident bytes (output multiplied by 0) and never
touches the dropped expert's unread slice. In a prefill batch an expert is dropped only when every slot
routing to it qualifies (it is read anyway otherwise). The slot with the largest share is never dropped: a
share of at least 1/k always exists, so at F <= 1 each token keeps an expert.

`DropReplay` applies the drop decisions recorded in a route trace (its `dropped` column) instead of the
rule: a run without streaming replays a streamed run's decisions, which is the gate that streaming with
drops computes what the resident model computes under the same drops.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.errors import UserError
from harness.formats.route_trace import DECODE, PREFILL, read_route_trace


@dataclass(frozen=True)
class DropRule:
    threshold: float  # F: drop below F x 1/k of the token's weight
    renorm: bool = True
    in_prefill: bool = False

    def active(self, phase: int) -> bool:
        return phase == DECODE or self.in_prefill


def choose(weights: np.ndarray, ids: np.ndarray, resident: np.ndarray, threshold: float) -> np.ndarray:
    """The slots to drop, a bool (n_tok, k) mask. `weights` and `ids` are (n_tok, k); `resident` is a bool
    (n_tok, k) mask of the slots whose expert is in the cache."""
    n_tok, k = ids.shape
    w = weights.astype(np.float64)
    total = w.sum(axis=1, keepdims=True)
    share = np.divide(w, total, out=np.full_like(w, np.inf), where=total > 0)
    drop = ~resident & (share < threshold / k)
    drop[np.arange(n_tok), np.argmax(share, axis=1)] = False
    if n_tok > 1 and drop.any():
        for e in np.unique(ids[drop]):
            at = ids == e
            if not drop[at].all():  # read anyway for another token: keep it everywhere
                drop[at] = False
    return drop


def apply(weights: np.ndarray, drop: np.ndarray, renorm: bool) -> None:
    """Zero the dropped slots of `weights` (n_tok, k, float32, written in place); with `renorm`, scale each
    such token's kept weights so the token's sum is unchanged. Rows without a drop are left bit for bit."""
    for row in np.flatnonzero(drop.any(axis=1)):
        w = weights[row]
        before = w.sum(dtype=np.float32)
        w[drop[row]] = 0
        if renorm:
            kept = w.sum(dtype=np.float32)
            if not kept > 0:
                raise ValueError(f"token {row}: every routed expert dropped (weights {weights[row].tolist()})")
            w *= np.float32(before / kept)


def substitute(ids: np.ndarray, drop: np.ndarray, weights: np.ndarray) -> None:
    """Point each dropped slot of `ids` (n_tok, k, written in place) at the same token's kept expert of the
    largest weight, which is resident or being read."""
    for row in np.flatnonzero(drop.any(axis=1)):
        kept = np.where(drop[row], -np.inf, weights[row])
        ids[row, drop[row]] = ids[row, int(np.argmax(kept))]


class DropReplay:
    """The drop decisions of a recorded route trace, by (phase, step, layer): prefill token j is step j,
    decode token s (0-based) is step s + 1."""

    def __init__(self, path: str | Path, n_layer: int, n_expert: int, k: int):
        tr = read_route_trace(path)
        h = tr.header
        if (h.n_layer, h.n_expert, h.k) != (n_layer, n_expert, k):
            raise UserError(f"drop replay {path}: recorded on {h.n_layer} layers x {h.n_expert} experts top-{h.k}, "
                            f"the run has {n_layer} x {n_expert} top-{k}; replay it on the model that recorded it")
        if not tr.has_dropped:
            raise UserError(f"drop replay {path}: the trace has no dropped column (route_trace v1); record one "
                            "with --drop-cold-experts F --route-trace FILE")
        self.path = str(path)
        self.k = k
        self.slots: dict[tuple[int, int, int, int], int] = {
            (r.phase, r.step, r.layer, r.slot): r.expert for r in tr.rows if r.dropped}

    def mask(self, phase: int, layer: int, decode_index: int, ids: np.ndarray) -> np.ndarray:
        """The recorded drops for this batch; raises ValueError when a dropped slot routed another expert
        here than in the recording (the replay has diverged from the recorded run)."""
        n_tok, k = ids.shape
        drop = np.zeros((n_tok, k), dtype=bool)
        steps = range(n_tok) if phase == PREFILL else [decode_index + 1]
        for j, step in enumerate(steps):
            for slot in range(k):
                e = self.slots.get((phase, step, layer, slot))
                if e is None:
                    continue
                if int(ids[j, slot]) != e:
                    raise ValueError(f"drop replay {self.path}: diverged from the recording: phase {phase} step "
                                     f"{step} layer {layer} slot {slot} routed expert {int(ids[j, slot])}, the "
                                     f"recording dropped expert {e}")
                drop[j, slot] = True
        return drop
