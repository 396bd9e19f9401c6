"""The hook's dense-weights stage (`--dense-weights anon`).

- with `--dense-weights anon` (a `dense.AnonDense`), every ask of the first graphs (prefill and the first
  decode; later decodes reuse that graph) is scanned: each source that is a dense weight is rebound to its
  anonymous copy on first sight, before compute, and a view still pointing into its old pages is moved
  along. The C front forwards every ask while that scan lasts (`forward_all`), then only the usual ones.

A stage of `StreamHook` (harness.engine.stream.hook), which holds the state; this class names what the stage uses.
"""

from __future__ import annotations

import ctypes
import time
from typing import TYPE_CHECKING

from harness.engine.model.ggml import GGML_MAX_SRC, OFF_DATA, OFF_SRC0, OFF_VIEW_OFFS, OFF_VIEW_SRC, tensor_at
from harness.engine.stream.common import TokenCounters, settle

if TYPE_CHECKING:
    from harness.engine.io.dense import AnonDense

_c_vp = ctypes.c_void_p
_c_size = ctypes.c_size_t
_Srcs = ctypes.c_void_p * GGML_MAX_SRC


class DenseStage:
    counters: TokenCounters
    dense: AnonDense | None
    _dense_scan: bool  # the first graphs are still being scanned
    _dense_seen: set[int]
    _filter: tuple | None  # the C front (hook_front.load_filter), whose forward_all ends with the scan

    def _scan_dense(self, t: int) -> None:
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        seen, d = self._dense_seen, self.dense
        assert d is not None
        for s in _Srcs.from_address(t + OFF_SRC0):
            if s and s not in seen:
                seen.add(s)
                tt = tensor_at(s)
                new = d.bind(s, tt.name.decode("utf-8", "replace"), tuple(int(x) for x in tt.ne), int(tt.type),
                             int(tt.data or 0))
                if new:
                    _c_vp.from_address(s + OFF_DATA).value = new
        vs = _c_vp.from_address(t + OFF_VIEW_SRC).value
        if vs:
            new = d.rebound_view(vs, _c_size.from_address(t + OFF_VIEW_OFFS).value,
                                 _c_vp.from_address(t + OFF_DATA).value or 0)
            if new:
                _c_vp.from_address(t + OFF_DATA).value = new
        settle(self.counters, t0, c0)

    def _end_dense_scan(self) -> None:
        """The graph is built and reused from here on: stop scanning, free the copies never bound."""
        self._dense_scan = False
        if self._filter is not None:
            self._filter[1].forward_all = 0
        if self.dense is not None:
            self.dense.finish()
