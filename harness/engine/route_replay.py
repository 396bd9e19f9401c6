"""Route replay: drive the engine's routing with a recorded `route_trace v1` (DESIGN.md section 8).

The hook overwrites each layer's selected expert ids with the trace's before anything uses them, so
the expert reads, the cache and the compute see a real model's access pattern on a synthetic model
of the same shape. The output text is then meaningless (labelled so); timings and bytes are the point.
Prefill token j of layer L takes the trace's prefill row j (cycling); decode token s takes the trace's
decode token s (cycling).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.engine.gguf_layout import ModelLayout
from harness.errors import UserError


class RouteReplay:
    def __init__(self, path: str | Path, layout: ModelLayout, k: int):
        from harness.replay.trace import load_trace

        tr = load_trace(path)
        self.path = str(path)
        if tr.n_expert != layout.n_expert or tr.n_layer != layout.n_layer:
            raise UserError(
                f"route trace {path}: recorded on {tr.n_layer} layers x {tr.n_expert} experts, the model has "
                f"{layout.n_layer} x {layout.n_expert}; generate a model of the trace's shape")
        if tr.k != k:
            raise UserError(f"route trace {path}: recorded at top-{tr.k}, the run uses top-{k}; "
                            f"add --n-expert-used {tr.k}")
        self.k = k
        self.prefill: dict[int, np.ndarray] = {}
        self.decode: dict[int, list[np.ndarray]] = {}
        for b in tr.batches:
            ids = np.asarray(b.experts, dtype=np.int32)
            if len(ids) % k:
                raise UserError(f"route trace {path}: layer {b.layer} has {len(ids)} ids, not a multiple of k={k}")
            rows = ids.reshape(-1, k)
            if b.token < 0:
                if b.layer not in self.prefill:  # the first turn's prompt
                    self.prefill[b.layer] = rows
            else:
                self.decode.setdefault(b.layer, []).append(rows[0])
        if not self.decode:
            raise UserError(f"route trace {path}: no decode tokens to replay")

    def ids(self, layer: int, phase: int, n_tok: int, decode_index: int) -> np.ndarray | None:
        """The ids to use for this layer batch, shape (n_tok, k); None if the trace has no such layer."""
        if phase == 0:
            rows = self.prefill.get(layer)
            if rows is None:
                return None
            return rows[np.arange(n_tok) % len(rows)]
        toks = self.decode.get(layer)
        if not toks:
            return None
        return np.tile(toks[decode_index % len(toks)], (n_tok, 1))
