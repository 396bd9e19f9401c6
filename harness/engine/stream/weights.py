"""The router's final weights in the graph, for the hook: which nodes hold them, reading them, and the drops
(`--drop-cold-experts`, `--drop-replay`) applied to one layer batch between top-k and the expert matmuls.

In llama.cpp's MoE builder the selected ids (`ffn_moe_topk-<il>`) are followed by the weights chain
`ffn_moe_weights` (get_rows of the probabilities at the selected ids), then, by architecture,
`ffn_moe_weights_softmax`, `_sum`/`_norm`, `_scaled`; the last of these is what the expert outputs are
multiplied by (`ffn_moe_weighted`), and the chain is computed before the expert matmuls. The hook isolates
each candidate node; the last one computed before the layer's first expert matmul is the final weights.
There the drops are decided and applied in place: the weights of the dropped slots are zeroed (and the
kept ones renormalised), and when streaming, their ids in the top-k node are pointed at a kept expert of
the same token, so the matmuls never touch a dropped expert's unread slice (harness.engine.routing.cold_drop).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.engine.model.ggml import GGML_TYPE_F32, OFF_NAME, tensor_at
from harness.engine.routing import cold_drop as dropping

PREFIX = b"ffn_moe_weights"  # the C front forwards the asks of nodes named so
# the nodes of the chain that can be the final weights (not _sum, not reshapes)
FINAL = (b"ffn_moe_weights-", b"ffn_moe_weights_softmax-", b"ffn_moe_weights_norm-", b"ffn_moe_weights_scaled-")


def is_final_weights(raw: bytes) -> bool:
    """`ffn_moe_weights_norm-3` is a candidate; `ffn_moe_weights_sum-3` and `... (reshaped)` are not."""
    name = raw.split(b"\0", 1)[0]
    return name.startswith(FINAL) and name.rsplit(b"-", 1)[1].isdigit()


def weights_array(node: int, n_tok: int, k: int) -> np.ndarray:
    """The node's data as a writable float32 (n_tok, k) array; ValueError unless it is contiguous F32 of
    that many elements."""
    tt = tensor_at(node)
    ne = [int(x) for x in tt.ne]
    want, nb = 4, []
    for n in ne:
        nb.append(want)
        want *= n
    if tt.type != GGML_TYPE_F32 or ne[0] * ne[1] * ne[2] * ne[3] != n_tok * k or list(tt.nb) != nb:
        raise ValueError(f"{tt.name.decode()}: expected contiguous F32 router weights of {n_tok} x {k}, got type "
                         f"{tt.type} ne {ne} nb {list(tt.nb)}")
    buf = (ctypes.c_float * (n_tok * k)).from_address(tt.data)
    return np.frombuffer(buf, dtype=np.float32).reshape(n_tok, k)


@dataclass
class Deferred:
    """A layer batch whose router weights are awaited (read at the layer's first expert-matmul ask)."""

    layer: int
    ids_view: np.ndarray  # the top-k node's ids, writable, (n_tok, k)
    ids: np.ndarray  # their copy, as the router chose them
    drops: bool  # drops apply: the cache lookups and reads wait for the decision
    event: Any = None  # the hook's RouteEvent when the batch was accounted at top-k time


@dataclass
class Finished:
    layer: int
    ids: np.ndarray  # as the router chose them
    weights: np.ndarray  # as the model computed them, before any drop
    drop: np.ndarray | None  # bool (n_tok, k); None when no drop applied to this batch
    event: Any = None


class WeightsStage:
    """The per-layer state between the top-k node and the first expert matmul."""

    def __init__(self, rule: dropping.DropRule | None, replay: dropping.DropReplay | None):
        self.rule = rule
        self.replay = replay
        self.node: dict[int, int] = {}  # layer -> the last candidate weights node computed in this pass
        self.pending: Deferred | None = None
        self.totals = [0, 0, 0, 0]  # decode slots, decode dropped, prefill slots, prefill dropped

    def on_topk(self, layer: int, phase: int, ids_view: np.ndarray, ids: np.ndarray) -> bool:
        """Start a batch; True when drops apply to it (then the caller defers the cache accounting)."""
        self.node.pop(layer, None)
        drops = self.replay is not None or (self.rule is not None and self.rule.active(phase))
        if drops and self.replay is None and self.rule is not None and self.rule.threshold <= 0:
            # F = 0 drops nothing (no share is below 0): count the slots, and let the lookups and reads
            # start at top-k time instead of waiting for the router weights (that wait cost 0.77x at F = 0)
            self.totals[0 if phase == 1 else 2] += ids.size
            drops = False
        self.pending = Deferred(layer, ids_view, ids, drops)
        return drops

    def on_weights(self, t: int) -> None:
        name = ctypes.string_at(t + OFF_NAME).decode()
        self.node[int(name.rsplit("-", 1)[1])] = t

    def finish(self, phase: int, decode_index: int, resident: set[tuple[int, int]] | None) -> Finished:
        """Read the final weights; where drops apply, decide them (`resident`: the cache's entries, None for
        a run without streaming, which only replays), zero and renormalise the weights in place, and when
        streaming point the dropped ids at a kept expert. ValueError on anything inconsistent."""
        d, self.pending = self.pending, None
        assert d is not None
        node = self.node.get(d.layer)
        if node is None:
            raise ValueError(f"layer {d.layer}: no router-weights node (ffn_moe_weights...) was computed before the "
                             "expert matmuls; route weights and drops are not available for this architecture")
        n_tok, k = d.ids.shape
        w = weights_array(node, n_tok, k)
        orig = w.copy()
        if not d.drops:
            return Finished(d.layer, d.ids, orig, None, d.event)
        assert self.rule is not None
        if self.replay is not None:
            mask = self.replay.mask(phase, d.layer, decode_index, d.ids)
        else:
            assert resident is not None
            res = np.array([(d.layer, e) in resident for e in d.ids.reshape(-1).tolist()], dtype=bool)
            mask = dropping.choose(orig, d.ids, res.reshape(n_tok, k), self.rule.threshold)
        if mask.any():
            try:
                dropping.apply(w, mask, self.rule.renorm)
            except ValueError as e:
                raise ValueError(f"layer {d.layer}: {e}") from None
            if resident is not None:  # streamed: the dropped slots compute from a kept expert's bytes
                dropping.substitute(d.ids_view, mask, orig)
        at = 0 if phase == 1 else 2
        self.totals[at] += n_tok * k
        self.totals[at + 1] += int(mask.sum())
        return Finished(d.layer, d.ids, orig, mask)
