"""`--route-ahead N` (lossy, deterministic): a layer's routing is committed N MoE layers early.

During decode, the hook's tap at MoE layer i hands out that layer's MoE input; the early router applies the
router of MoE layer i+N to it and the result is committed: those are the experts layer i+N will compute (the hook
overwrites that layer's selected ids in place at its routing node, before the router weights and the matmuls
read them), so their reads can start N layers early and are never wasted. The first N MoE layers of a token use
their own routing; so does the prompt (prefill is exact: decode only). N counts MoE layers (a model's dense
layers are skipped). Every committed layer's slot agreement with its own router's choice at that point (the
fraction of its k slots whose committed expert is among the true top-k) is counted per token.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from harness.engine.routing.early_router import EarlyRouter, slot_agreement, top_k_ids

DECODE = 1

# on_commit(layer, ids int32 [n_tok, k]): the hook's early cache accounting and reads for that layer
Commit = Callable[[int, np.ndarray], None]


class RouteAhead:
    def __init__(self, router: EarlyRouter, n: int, moe_layers: list[int], k_of: Callable[[int], int]):
        self.router = router
        self.n = n
        self.k_of = k_of  # the layer's top-k (the override, or the model's own per layer)
        self.target_of = {moe_layers[i]: moe_layers[i + n] for i in range(len(moe_layers) - n)} if n > 0 else {}
        self.committed: dict[int, np.ndarray] = {}
        self.on_commit: Commit | None = None
        self.hits = self.slots = 0  # since the last take_agreement()
        self.total_hits = self.total_slots = 0

    def tap(self, layer: int, phase: int, decode_index: int, hidden: np.ndarray) -> None:
        """A StreamHook tap: commit the routing of the layer N MoE layers on from this layer's MoE input."""
        if phase != DECODE:
            return
        target = self.target_of.get(layer)
        if target is None:
            return
        ids = top_k_ids(self.router.scores(target, hidden, ranking_only=True), self.k_of(target))
        self.committed[target] = ids
        if self.on_commit is not None:
            self.on_commit(target, ids)

    def take(self, layer: int, phase: int) -> np.ndarray | None:
        """At the layer's routing node: its committed ids (then forgotten), or None (its own routing)."""
        if phase != DECODE:
            return None
        return self.committed.pop(layer, None)

    def score(self, committed: np.ndarray, true: np.ndarray) -> None:
        h, n = slot_agreement(committed, true)
        self.hits += h
        self.slots += n

    def take_agreement(self) -> float | None:
        """The slot agreement since the last call (one token), or None when no layer was routed ahead."""
        h, n = self.hits, self.slots
        self.hits = self.slots = 0
        self.total_hits += h
        self.total_slots += n
        return h / n if n else None

    @property
    def agreement(self) -> float | None:
        """Over the whole run so far."""
        return self.total_hits / self.total_slots if self.total_slots else None
