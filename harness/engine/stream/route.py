"""The hook's routing stage: the selected expert ids at each layer's routing node, and the router's weights.

- `ffn_moe_topk-<il>` (a VIEW of the argsort, a TOP_K, or a GET_ROWS where an architecture selects by token id,
  as deepseek4's hash-routed layers do) is isolated (True on ask); in its non-ask call the selected ids are
  materialised: the cache accounts the layer batch and reads for the misses go to the lanes.
- with `--drop-cold-experts` (a `drop.DropRule`), a `--drop-replay` (a `drop.DropReplay`) or a route trace,
  the router's final weights node (`ffn_moe_weights`, `_softmax`, `_norm`, `_scaled`: the last one computed is
  the one the expert outputs are multiplied by) is isolated too; at the layer's first expert-matmul ask the
  weights are read (the trace's weight column) and, where drops apply, the layer batch's cache accounting
  and reads wait until then: the dropped slots' weights are zeroed (the kept ones renormalised) and their
  ids pointed at a kept expert, so nothing reads the dropped slices (harness.engine.routing.cold_drop).
- with `--route-ahead N` (a `route_ahead.RouteAhead`, one of the taps): a decode layer's routing committed N MoE
  layers early overwrites the selected ids at its routing node (its reads: harness.engine.stream.account).

A stage of `StreamHook` (harness.engine.stream.hook), which holds the state; this class names what the stage uses.
"""

from __future__ import annotations

import ctypes
import time
from typing import TYPE_CHECKING

import numpy as np

from harness.engine.model.ggml import GGML_MAX_NAME, GGML_TYPE_I32, GgmlTensor
from harness.engine.stream.account import AccountStage
from harness.engine.stream.common import HookError, Tap, settle
from harness.engine.stream.dense_stage import DenseStage

if TYPE_CHECKING:
    from harness.engine.routing.cold_drop import DropReplay
    from harness.engine.routing.route_ahead import RouteAhead
    from harness.engine.routing.route_replay import RouteReplay
    from harness.engine.stream.weights import WeightsStage

_perf_ns, _thread_ns = time.perf_counter_ns, time.thread_time_ns


def _head_fields() -> list[tuple[str, type]]:
    """The fields of `struct ggml_tensor` a routing node's non-ask call reads, at their offsets (padding between):
    one small ctypes view with scalar fields costs far less per call than the whole mirror and its arrays."""
    G = GgmlTensor
    want = [("type", ctypes.c_int, G.type.offset), ("ne0", ctypes.c_int64, G.ne.offset),
            ("ne1", ctypes.c_int64, G.ne.offset + 8), ("nb1", ctypes.c_size_t, G.nb.offset + 8),
            ("data", ctypes.c_void_p, G.data.offset), ("name", ctypes.c_char * GGML_MAX_NAME, G.name.offset)]
    fields: list[tuple[str, type]] = []
    pos = 0
    for name, ty, off in want:
        if off > pos:
            fields.append((f"_pad{len(fields)}", ctypes.c_char * (off - pos)))
        fields.append((name, ty))
        pos = off + ctypes.sizeof(ty)
    return fields


class _TopkHead(ctypes.Structure):
    _fields_ = _head_fields()


_BYTES: dict[int, type[ctypes.Array[ctypes.c_char]]] = {}  # n -> c_char * n


def _bytes_type(n: int) -> type[ctypes.Array[ctypes.c_char]]:
    t = _BYTES[n] = ctypes.c_char * n
    return t


def _text(name: bytes) -> str:
    return name.decode("utf-8", "replace")


class RouteStage(AccountStage, DenseStage):
    topk_prefix: bytes
    replay: RouteReplay | None
    route_ahead: RouteAhead | None
    stage: WeightsStage | None  # the router weights: route traces and drops
    drop_replay: DropReplay | None
    _want_weights: bool
    k_effective: int | None
    decode_index: int
    _first_moe_layer: int
    _tap_due: int | None
    taps: list[Tap]
    _topk_layer: dict[bytes, int]  # routing node name -> its layer

    def _on_topk(self, t: int) -> None:
        t0, c0 = _perf_ns(), _thread_ns()
        h = _TopkHead.from_address(t)
        name = h.name
        il = self._topk_layer.get(name)
        if il is None:  # once per routing node name
            il = self._topk_layer[name] = int(name[len(self.topk_prefix):])
        self._routed.add(il)
        if self.taps:
            self._tap_due = il
        if self._ctrace is not None:
            self._ctrace.layer = il
        ahead = self.route_ahead.take(il, self.phase) if self.route_ahead is not None else None
        held = self._held
        if held is not None:  # the layers before this one are computed: their deferred drops go now
            for la in [la for la in held if la < il or il == self._first_moe_layer]:
                del held[la]
                self._drop(self._deferred.pop(la, []))
        if h.type != GGML_TYPE_I32:
            raise HookError(f"{_text(name)}: expected I32 expert ids, got ggml type {h.type}")
        k, n_tok = h.ne0, h.ne1
        self.k_effective = k
        phase = self.phase
        if phase == 1 and il == self._first_moe_layer:
            self.decode_index += 1
            if self._dense_scan and self.decode_index >= 1:
                self._end_dense_scan()
        n_exp = self.layout.n_expert
        ids = view = None
        replay = self.replay
        if n_tok == 1 and ahead is None and not self._want_weights and (replay is None or phase == 1):
            row = replay.decode_row(il, self.decode_index) if replay is not None else None  # no numpy here
            if row is not None:
                if k != replay.k:
                    raise HookError(f"{_text(name)}: the route trace has {replay.k} ids, the graph selects {k}")
                # before anything reads them: weights and matmuls follow the trace
                n = len(row.packed)
                (_BYTES.get(n) or _bytes_type(n)).from_address(h.data).raw = row.packed
                flat_ids, lo, hi = row.ids, row.lo, row.hi
            else:
                flat_ids = (ctypes.c_int32 * k).from_address(h.data)[:]
                lo, hi = min(flat_ids), max(flat_ids)
        else:
            nb1 = h.nb1
            stride = nb1 // 4
            buf = (ctypes.c_int32 * (stride * (n_tok - 1) + k)).from_address(h.data)
            view = np.lib.stride_tricks.as_strided(np.frombuffer(buf, dtype=np.int32), shape=(n_tok, k),
                                                   strides=(nb1, 4))
            if replay is not None:
                forced = replay.ids(il, phase, n_tok, self.decode_index)
                if forced is not None:
                    view[:, :] = forced  # before anything reads them: weights and matmuls follow the trace
            if ahead is not None:
                if ahead.shape != view.shape:
                    raise HookError(f"{_text(name)}: routed ahead {ahead.shape} ids, the graph selects {view.shape}")
                self.route_ahead.score(ahead, view)
                view[:, :] = ahead  # the committed routing, before the weights and the matmuls read the ids
            ids = view.copy()
            flat_ids = ids.reshape(-1).tolist()
            lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= n_exp:
            raise HookError(f"{_text(name)}: expert id out of range 0..{n_exp - 1}: {lo}..{hi}")
        st = self.stage
        if st is not None:
            assert ids is not None and view is not None
            if st.on_topk(il, phase, view, ids):  # lookups and reads wait for the drops (_finish_weights)
                settle(self.counters, t0, c0)
                return
        if self.cache is None or il in self._early:  # resident, or accounted and read at commit time
            self._early.discard(il)
            settle(self.counters, t0, c0)
            return
        self._t_submitted = 0
        ev = self._account(il, flat_ids, ids)
        if st is not None and st.pending is not None:
            st.pending.event = ev
        t1 = settle(self.counters, t0, c0)
        if self._t_submitted:  # after the batch's reads were submitted: beside them
            self._hideable_ns += t1 - self._t_submitted
            self._t_submitted = 0

    @property
    def drop_totals(self) -> list[int]:
        """Decode slots, decode slots dropped, prefill slots, prefill slots dropped (where drops applied)."""
        return self.stage.totals if self.stage is not None else [0, 0, 0, 0]

    def _finish_weights(self) -> None:
        """At the layer's first expert-matmul ask: the router weights are computed. Read them (route traces),
        apply the drops (harness.engine.stream.weights), then account the kept experts."""
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        st = self.stage
        assert st is not None and st.pending is not None
        if st.pending.drops and self.drop_replay is None and self._evict_due:
            self._evict_now()  # the residency the lookups will see
        try:
            f = st.finish(self.phase, self.decode_index, self.cache.resident if self.cache is not None else None)
        except ValueError as e:
            raise HookError(str(e)) from None
        if f.drop is None:
            if f.event is not None:
                f.event.weights = f.weights
        elif self.cache is not None:
            ev = self._account(f.layer, f.ids.reshape(-1)[~f.drop.reshape(-1)].tolist(), f.ids)
            if ev is not None:
                ev.weights, ev.dropped = f.weights, f.drop
        settle(self.counters, t0, c0)
