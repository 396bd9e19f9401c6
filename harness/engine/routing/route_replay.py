"""Route replay: drive the engine's routing with a recorded `route_trace v1` (harness.formats.route_trace).

The hook overwrites each layer's selected expert ids with the trace's before anything uses them, so
the expert reads, the cache and the compute see a real model's access pattern on a synthetic model
of the same shape. The output text is then meaningless (labelled so); timings and bytes are the point.
Prefill token j of layer L takes row j of the trace's first prompt that routes layer L (cycling); decode
token s takes the trace's decode token s (cycling).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import NamedTuple

import numpy as np

from harness.engine.model.gguf_layout import ModelLayout
from harness.errors import UserError
from harness.formats.route_trace import PREFILL, Route, read_route_trace


class DecodeRow(NamedTuple):
    """One decode token's ids at one layer, in the forms the hook's one-token fast path uses."""

    ids: list[int]  # read-only: shared by every use of the row
    packed: bytes  # the ids as int32, native byte order: what the hook writes into the routing node
    lo: int  # min(ids)
    hi: int  # max(ids)


class RouteReplay:
    def __init__(self, path: str | Path, layout: ModelLayout, k: int):
        tr = read_route_trace(path)
        h = tr.header
        self.path = str(path)
        if h.n_expert != layout.n_expert or h.n_layer != layout.n_layer:
            raise UserError(
                f"route trace {path}: recorded on {h.n_layer} layers x {h.n_expert} experts, the model has "
                f"{layout.n_layer} x {layout.n_expert}; generate a model of the trace's shape")
        if h.k != k:
            raise UserError(f"route trace {path}: recorded at top-{h.k}, the run uses top-{k}; "
                            f"add --n-expert-used {h.k}")
        self.k = k
        prefill, prompts, decode = _routed(tr.rows)
        for layer, ids in [*prompts, *((la, g) for la, gs in decode.items() for g in gs)]:
            if len(ids) % k:
                raise UserError(f"route trace {path}: layer {layer} has {len(ids)} ids, not a multiple of k={k}")
        self.prefill: dict[int, np.ndarray] = {
            layer: np.asarray(ids, dtype=np.int32).reshape(-1, k) for layer, ids in prefill.items()}
        self.decode: dict[int, list[np.ndarray]] = {
            layer: [np.asarray(g[:k], dtype=np.int32) for g in groups] for layer, groups in decode.items()}
        if not self.decode:
            raise UserError(f"route trace {path}: no decode tokens to replay")
        self._rows: dict[int, list[DecodeRow]] = {
            layer: [_decode_row(g.tolist()) for g in gs] for layer, gs in self.decode.items()}

    def decode_row(self, layer: int, decode_index: int) -> DecodeRow | None:
        """One decode token's ids (the hook's one-token fast path; the row `ids` tiles), or None."""
        rows = self._rows.get(layer)
        return rows[decode_index % len(rows)] if rows else None

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


def _decode_row(ids: list[int]) -> DecodeRow:
    return DecodeRow(ids, struct.pack(f"={len(ids)}i", *ids), min(ids), max(ids))


def _routed(rows: list[Route]) -> tuple[dict[int, list[int]], list[tuple[int, list[int]]],
                                        dict[int, list[list[int]]]]:
    """(layer -> the expert ids of the first prompt that routes it, every prompt token's K in turn;
    (layer, ids) of every prompt's layer; layer -> one id list per decode token). A prompt ends at a
    decode row or at a new turn's prompt; a decode token's ids in one layer are the consecutive rows of
    one (turn, step, layer)."""
    prompts: dict[tuple[int, int], list[int]] = {}
    first_prompt: dict[int, int] = {}
    decode: dict[int, list[list[int]]] = {}
    prompt, prev, key = 0, None, None
    for r in rows:
        if r.phase == PREFILL:
            if prev is not None and (prev.phase != PREFILL or prev.turn != r.turn):
                prompt += 1
            first_prompt.setdefault(r.layer, prompt)
            prompts.setdefault((prompt, r.layer), []).append(r.expert)
            key = None
        else:
            if (r.turn, r.step, r.layer) != key:
                key = (r.turn, r.step, r.layer)
                decode.setdefault(r.layer, []).append([])
            decode[r.layer][-1].append(r.expert)
        prev = r
    prefill = {layer: prompts[(p, layer)] for layer, p in first_prompt.items()}
    return prefill, [(layer, ids) for (_, layer), ids in prompts.items()], decode
