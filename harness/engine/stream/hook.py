"""The router hook on llama.cpp's `cb_eval`: routed experts are read from flash when a token needs them.

Contract (ggml_backend_sched with an eval callback): for each graph node the scheduler first asks
(`ask=True`); a True answer ends the current group, which is computed and synchronised, and the node is
then passed again with `ask=False`. So:
- the routing node `ffn_moe_topk-<il>` and the router's weights nodes: harness.engine.stream.route.
- a MUL_MAT_ID node whose src[0] is a routed-expert tensor: on its first ask the tensor is bound
  (harness.engine.stream.bind); on every ask we wait for that tensor's reads. Before the first wait the cache
  decides the batch's evictions (the policy's bookkeeping then runs while the reads are in flight, not
  before they start; in decode on the evictor's helper thread, harness.engine.cache.evictor) and the evicted slices are
  dropped off the compute thread (harness.engine.stream.account).
  Non-last expert matmuls of a layer (gate, up) are isolated too, so the last one's reads (down) overlap their
  compute.
- dense weights rebound to anonymous copies: harness.engine.stream.dense_stage; taps: harness.engine.stream.taps;
  the compiled front that answers the other asks: harness.engine.stream.front.
An exception in a ctypes callback would be swallowed and the graph silently cut short, so everything
is caught, recorded, the graph is aborted, and the session raises it after llama_decode returns.

This module is the callback dispatch and the hook's state; each stage is a base class of `StreamHook` in its
own module (hook_bind <- hook_account <- hook_route; hook_dense, hook_taps), calling only the stages below it.
"""

from __future__ import annotations

import ctypes
from concurrent.futures import Future
from typing import TYPE_CHECKING

from harness.engine.cache.evictor import Evictor
from harness.engine.cache.expert_cache import ExpertCache
from harness.engine.io.reader import ExpertReader
from harness.engine.io.release import DropBatch, Dropper
from harness.engine.io.vm import SharedSlot
from harness.engine.model.ggml import (
    GGML_OP_GET_ROWS,
    GGML_OP_MUL_MAT_ID,
    GGML_OP_TOP_K,
    GGML_OP_VIEW,
    OFF_NAME,
    OFF_OP,
    OFF_SRC0,
)
from harness.engine.model.gguf_layout import ModelLayout
from harness.engine.stream.account import drop_all
from harness.engine.stream.common import Bound, HookError, RouteEvent, Tap, TokenCounters
from harness.engine.stream.front import FILTER_VERSION, FILTER_VERSION_WEIGHTS, GET_ROWS_VERSION, STALE, load_filter
from harness.engine.stream.route import RouteStage
from harness.engine.stream.taps import TapStage
from harness.engine.stream.weights import PREFIX as WEIGHTS_PREFIX
from harness.engine.stream.weights import WeightsStage, is_final_weights

if TYPE_CHECKING:
    from harness.engine.cache.prefetch import Prefetcher
    from harness.engine.io.dense import AnonDense
    from harness.engine.io.tracing import Tracing
    from harness.engine.routing.cold_drop import DropReplay, DropRule
    from harness.engine.routing.route_ahead import RouteAhead
    from harness.engine.routing.route_replay import RouteReplay

__all__ = ["FILTER_VERSION", "FILTER_VERSION_WEIGHTS", "GET_ROWS_VERSION", "STALE", "Bound", "HookError",
           "RouteEvent", "StreamHook", "Tap", "TokenCounters", "load_filter"]

_c_int = ctypes.c_int
_c_vp = ctypes.c_void_p
_string_at = ctypes.string_at


class StreamHook(RouteStage, TapStage):
    NOT_EXPERT = None

    def __init__(self, layout: ModelLayout, cache: ExpertCache | None, reader: ExpertReader | None,
                 record_routes: bool = False, preload: bool = False, use_c_filter: bool = True,
                 replay: RouteReplay | None = None, dense: AnonDense | None = None,
                 drop: DropRule | None = None, drop_replay: DropReplay | None = None,
                 prefetch: Prefetcher | None = None, tracing: Tracing | None = None,
                 route_ahead: RouteAhead | None = None, evict_thread: bool = False):
        self.layout = layout
        self.tracing = tracing  # --io-trace / --compute-trace (harness.engine.io.tracing); None: no cost
        self._iotrace = tracing.io if tracing is not None else None
        self._ctrace = tracing.compute if tracing is not None else None
        self.cache = cache
        self.reader = reader
        self.topk_prefix = (layout.row.topk_node + "-").encode()
        self.bound: dict[int, Bound | None] = {}
        self.layer_bound: dict[int, list[Bound]] = {}
        self.last_addr: dict[int, int] = {}  # layer -> address of its last expert matmul's tensor (down)
        self.pending: dict[int, list[int]] = {}  # layer -> misses not yet read for unbound tensors
        self.inflight: dict[int, list[Future]] = {}
        # evicted slices' pages, released off the compute thread; with read-ahead one layer at a time: a prefetch
        # of a key still in an open batch must wait for it (by hand, 30B shape, --prefetch 1 --predict-prefetch,
        # 2 runs each: mgmt 78-83 ms/token batching 4 layers, 58-60 one by one; lru without read-ahead 22-25 both)
        self.dropper = Dropper(drop_all, every=1 if prefetch is not None else 4)
        self.pending_drop: dict[tuple[int, int], DropBatch] = {}
        self._recent_drops: list[DropBatch] = []
        self.error: BaseException | None = None
        self.counters = TokenCounters()
        self.k_effective: int | None = None
        self.record_routes = record_routes
        self.routes: list[RouteEvent] = []
        self.phase = 0
        self.preload = preload  # read every expert of a layer at its first pass (--cache-preload)
        self.replay = replay  # RouteReplay: overwrite the selected ids with a recorded trace's
        self.decode_index = -1
        self._first_moe_layer = min(layout.by_layer)
        self._routed: set[int] = set()  # layers whose routing node has been seen (it precedes their matmuls)
        self._topk_layer: dict[bytes, int] = {}  # routing node name -> its layer (parsed once)
        self._bound_all: set[int] = set()  # layers whose expert tensors are all bound (bound once, for good)
        self._drop_bounds: dict[int, tuple[tuple[Bound, ...], int]] = {}  # such a layer: its bounds, their nb2 sum
        self._preloaded: set[int] = set()
        self._evict_due = False  # the last batch's evictions are still to be decided
        self._hideable_ns = 0  # mgmt time beside in-flight demand reads, hidden if the next wait is a real one
        self._t_submitted = 0  # when _on_topk's batch reads were submitted (0: none in this section)
        self._last_kind = layout.row.expert_tensors[-1]  # the row lists them in graph order: down last
        self.dense = dense  # --dense-weights anon: rebind dense weights on first sight
        self._dense_scan = dense is not None
        self._dense_seen: set[int] = set()
        # no cache: every layer's tensors of a kind share one buffer whose pages are reused every token
        self.shared = cache is not None and not cache.enabled and reader is not None and not preload
        self._slots: dict[str, SharedSlot] = {}
        self.drop = drop  # --drop-cold-experts: the rule
        self.drop_replay = drop_replay  # --drop-replay: recorded decisions instead of the rule
        self._want_weights = record_routes or drop is not None or drop_replay is not None
        self.stage = WeightsStage(drop, drop_replay) if self._want_weights else None
        self.prefetch = prefetch
        self.spec_wait: dict[int, list[Future]] = {}  # tensor address -> prefetch reads its next matmul needs
        self.taps: list[Tap] = []  # called with each layer's MoE input (see the module docstring)
        self._tap_due: int | None = None  # the layer whose routing node was seen and whose input is not tapped yet
        self.tap_skipped: set[int] = set()  # layers whose matmul input is not the plain MoE input (llama4)
        self.route_ahead = route_ahead
        self._early: set[int] = set()  # layers accounted (and read) at commit time, before their routing node
        self._held: dict[int, set[tuple[int, int]]] | None = None  # layer -> its batch, accounted, not computed
        self._deferred: dict[int, list[tuple[int, int]]] = {}  # layer -> entries evicted while it was held
        # decode evictions on a helper thread (harness.engine.cache.evictor), where nothing else reads the cache
        # between a batch's first expert matmul and the next layer's lookups: not with read-ahead (it admits right
        # after the evictions), route-ahead (held batches) or router weights (drops read the residency)
        self.evictor = (Evictor() if evict_thread and cache is not None and cache.enabled and reader is not None
                        and prefetch is None and route_ahead is None and not self._want_weights else None)
        if route_ahead is not None:
            self.taps.append(route_ahead.tap)
            if cache is not None and cache.enabled and reader is not None and not self.shared:
                self._held = {}
                route_ahead.on_commit = self._commit_early
        from llama_cpp import llama_cpp as L

        cb = self._callback if self._ctrace is None else self._ctrace.wrap(self._callback)
        self.py_cfunc = L.ggml_backend_sched_eval_callback(cb)
        self.cfunc = self.py_cfunc
        self.user_data: int | None = None
        self.front = "python"
        get_rows = bool(layout.token_routed_layers)
        self._filter = (load_filter(self.py_cfunc, self.topk_prefix, self._dense_scan, get_rows, self._want_weights)
                        if use_c_filter else None)
        self.front_note = ""
        if self._filter == STALE:
            self._filter = None
            needs = ("token-id routed layers" if get_rows else
                     "route weights or drops" if self._want_weights else "--dense-weights anon")
            self.front_note = (f"bmoe: the compiled callback front (cfilter.c) predates {needs}; using the "
                               "pure-Python front (slower): rebuild it with pip install -e .")
        if self._filter is not None:
            lib, struct = self._filter
            self.cfunc = L.ggml_backend_sched_eval_callback(ctypes.cast(lib.bmoe_filter_cb, ctypes.c_void_p).value)
            self.user_data = ctypes.addressof(struct)
            self.front = "c-filter"

    # -- the callback -------------------------------------------------------------------------
    def _callback(self, t: int, ask: bool, _ud) -> bool:
        if self.error is not None:
            return ask  # abort: the following non-ask answers False
        try:
            if ask:
                if self._dense_scan:
                    self._scan_dense(t)
                op = _c_int.from_address(t + OFF_OP).value
                if op == GGML_OP_MUL_MAT_ID:
                    st = self.stage
                    if st is not None and st.pending is not None:  # the layer's first expert matmul
                        self._finish_weights()
                    if self._tap_due is not None:
                        self._run_taps(t)
                    if self.cache is None:
                        return False  # replay-only run (mmap baseline): experts stay in the file mapping
                    src = _c_vp.from_address(t + OFF_SRC0).value
                    b = self.bound.get(src, 0)
                    if b == 0:
                        b = self._bind(src)
                    if b is None:
                        return False
                    if self._evict_due or (self.prefetch is not None and self.prefetch.planned):
                        self._evict_now(True)  # the last batch's reads are in flight now: decide evictions meanwhile
                    futs = self.inflight.pop(src, None)
                    if futs:
                        self._wait(futs)
                    if self.spec_wait:
                        futs = self.spec_wait.pop(src, None)
                        if futs:
                            self._wait(futs, count=False)  # the prefetcher counts its own reads
                    # isolate gate/up only while the layer's down slices are still being read, so those
                    # reads overlap gate/up compute; with nothing in flight, no extra graph split
                    down = self.last_addr.get(b.et.layer, 0)
                    return b.isolate and bool(self.inflight.get(down) or self.spec_wait.get(down))
                if op == GGML_OP_VIEW or op == GGML_OP_TOP_K or op == GGML_OP_GET_ROWS:
                    if _string_at(t + OFF_NAME, 20).startswith(self.topk_prefix):
                        return True
                if self._want_weights:
                    return is_final_weights(_string_at(t + OFF_NAME, 40))
                return False
            if _c_int.from_address(t + OFF_OP).value != GGML_OP_MUL_MAT_ID:
                if self.stage is not None and _string_at(t + OFF_NAME, 20).startswith(WEIGHTS_PREFIX):
                    self.stage.on_weights(t)
                else:
                    self._on_topk(t)
            return True
        except BaseException as e:  # noqa: BLE001 - must not escape into ctypes
            self.error = e
            return ask

    def take_routes(self) -> list[RouteEvent]:
        """The routing decisions recorded since the last call (with record_routes)."""
        r, self.routes = self.routes, []
        return r

    def take_counters(self) -> TokenCounters:
        self._join_evict()
        if self._evict_due:  # settle the last batch's evictions (normally done at its first wait)
            self._evict_now()
        if self.prefetch is not None:
            p, c = self.prefetch.take(), self.counters
            c.read_bytes += p.read_bytes
            c.io_ns += p.io_ns
            c.prefetch_bytes, c.prefetch_used_bytes, c.prefetch_wasted_bytes = (p.prefetch_bytes, p.used_bytes,
                                                                                p.wasted_bytes)
        self.dropper.flush()  # the token's last evictions go now, not with the next token's
        c, self.counters = self.counters, TokenCounters()
        drops, self._recent_drops = self._recent_drops, []
        for f in drops:  # an eviction that failed must not pass silently
            if f.done() and f.exception() is not None:
                raise HookError(f"evicting expert pages failed: {f.exception()}")
        return c

    def close(self) -> None:
        if self.evictor is not None:
            self.evictor.close()
        self.dropper.close()

    def raise_if_failed(self) -> None:
        if self.error is not None:
            e, self.error = self.error, None
            if isinstance(e, KeyboardInterrupt):  # Ctrl-C landed inside the callback: the user's interrupt
                raise KeyboardInterrupt
            raise HookError(f"streaming hook failed: {type(e).__name__}: {e}") from e
