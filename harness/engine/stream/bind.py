"""The hook's binding stage: routed-expert tensors bound to their memory, and the reads into them.

- a MUL_MAT_ID node whose src[0] is a routed-expert tensor: on its first ask the tensor's data pointer
  is rebound to an anonymous reservation (asks run before compute, so nothing is ever faulted in through
  the file mapping). Without a cache, every layer's tensor of one kind is placed in one shared buffer
  (`vm.SharedSlot`): the topk node of layer L+1 is computed only after layer L's matmuls, so its reads can never
  overwrite slices still in use, and the buffer's pages are reused every token instead of being faulted (zeroed,
  charged) and released again.

A stage of `StreamHook` (harness.engine.stream.hook); its own state is one object (harness.engine.stream.state), and
this class names what else of the hook the stage uses.
"""

from __future__ import annotations

import ctypes
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING

from harness.engine.io.vm import Reservation, SharedSlot
from harness.engine.model.ggml import OFF_DATA, OFF_NAME, tensor_at
from harness.engine.model.gguf_layout import ModelLayout
from harness.engine.stream.common import HIDDEN_WAIT_NS, Bound, HookError, TokenCounters, settle

if TYPE_CHECKING:
    from harness.engine.io.reader import ExpertReader, Read
    from harness.engine.io.tracing import ComputeTrace, IoTrace
    from harness.engine.stream.state import BindState, HiddenClock, RouteState

_c_vp = ctypes.c_void_p
_string_at = ctypes.string_at


class BindStage:
    layout: ModelLayout
    reader: ExpertReader | None
    counters: TokenCounters
    binds: BindState  # this stage's own
    hidden: HiddenClock
    routing: RouteState  # its `routed` layers: a matmul's routing node came first
    _iotrace: IoTrace | None
    _ctrace: ComputeTrace | None

    def _bind(self, src: int) -> Bound | None:
        name = _string_at(src + OFF_NAME).decode()
        et = self.layout.experts.get(name)
        if et is None:
            self.binds.bound[src] = None
            return None
        if et.layer not in self.routing.routed:
            raise HookError(
                f"{name}: an expert matmul with no '{self.layout.row.topk_node}-{et.layer}' routing node before it; "
                f"'{self.layout.arch}' does not route through llama.cpp's standard MoE builder, so it needs a row "
                "of its own in the registry")
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        tt = tensor_at(src)
        shape = tuple(int(tt.ne[i]) for i in range(len(et.shape)))
        if shape != et.shape or int(tt.nb[2]) != et.nb2 or int(tt.type) != et.ggml_type:
            raise HookError(
                f"{name}: graph tensor shape {shape} nb2 {int(tt.nb[2])} type {int(tt.type)} does not match the "
                f"GGUF ({et.shape}, {et.nb2}, {et.ggml_type}); was the model loaded with weight repacking?")
        bs = self.binds
        res = self._slot(et.kind).view(et.nbytes, et.abs_offset) if bs.shared else \
            Reservation(et.nbytes, et.abs_offset, bs.pool)
        old = int(tt.data or 0)
        _c_vp.from_address(src + OFF_DATA).value = res.data
        if old and self.reader is not None:
            self.reader.release_mapped(et.path, et.abs_offset, et.nbytes, old)
        b = Bound(src, et, res, isolate=et.kind != bs.last_kind)
        if self.reader is not None and self._iotrace is None:  # --io-trace: each read carries its tag (_reads)
            b.lane_id = self.reader.register(et.path, et.abs_offset, et.nb2, res.addr_of(et.abs_offset))
        if not b.isolate:
            bs.last_addr[et.layer] = src
        bs.bound[src] = b
        bs.layer_bound.setdefault(et.layer, []).append(b)
        misses = bs.pending.get(et.layer)
        if misses:
            bs.inflight[src] = [self._submit_many(b, misses)]
        settle(self.counters, t0, c0)
        return b

    def _slot(self, kind: str) -> SharedSlot:
        slots = self.binds.slots
        if kind not in slots:
            slots[kind] = SharedSlot(max(t.nbytes for t in self.layout.experts.values() if t.kind == kind))
        return slots[kind]

    def _reads(self, b: Bound, experts: list[int]) -> list[Read]:
        """(file_pos, length, addr, io-trace tag) of each expert's slice of tensor `b`."""
        et, tr = b.et, self._iotrace
        nb2, off, addr_of = et.nb2, et.abs_offset, b.res.addr_of
        if tr is None:
            return [(p, nb2, addr_of(p), None) for p in [off + e * nb2 for e in experts]]
        return [(off + e * nb2, nb2, addr_of(off + e * nb2), tr.record(et.layer, e, et.kind, off + e * nb2, nb2))
                for e in experts]

    def _submit_many(self, b: Bound, experts: list[int]) -> Future:
        """One call for a tensor's missed slices (reader.submit_many), not one submit per slice."""
        return self.reader.submit_many(b.et.path, self._reads(b, experts))

    def _submit_layer(self, bounds: list[Bound], experts: list[int]) -> None:
        """_submit_many for each of a layer's bound tensors, in one reader call: reader.submit_registered given the
        expert ids when the tensors are registered (_bind), else reader.submit_layer given each read."""
        if bounds[0].lane_id >= 0:  # registered (_bind): the reader computes each read
            futs = self.reader.submit_registered([b.lane_id for b in bounds], experts)
        else:
            futs = self.reader.submit_layer([(b.et.path, self._reads(b, experts)) for b in bounds])
        self.hidden.submitted = time.perf_counter_ns()  # the rest of this mgmt section runs beside these reads
        inflight = self.binds.inflight
        for b, f in zip(bounds, futs, strict=True):
            inflight.setdefault(b.addr, []).append(f)

    def _wait(self, futs: list[Future], count: bool = True) -> None:
        t0 = time.perf_counter_ns()
        c = self.counters
        for f in futs:
            got, ns = f.result()
            if count:
                c.read_bytes += got
                c.io_ns += ns
        t1 = time.perf_counter_ns()
        c.stall_ns += t1 - t0
        if count:  # the management done while these reads ran was hidden if the thread still had to wait
            if t1 - t0 > HIDDEN_WAIT_NS:
                c.mgmt_hidden_ns += self.hidden.ns
            self.hidden.ns = 0
        if self._ctrace is not None:
            self._ctrace.wait(t0, t1)
