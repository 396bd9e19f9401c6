"""The router hook on llama.cpp's `cb_eval`: routed experts are read from flash when a token needs them.

Contract (ggml_backend_sched with an eval callback): for each graph node the scheduler first asks
(`ask=True`); a True answer ends the current group, which is computed and synchronised, and the node is
then passed again with `ask=False`. So:
- the routing node `ffn_moe_topk-<il>` and the router's weights nodes: harness.engine.stream.route.
- a MUL_MAT_ID node whose src[0] is a routed-expert tensor: on its first ask the tensor is bound
  (harness.engine.stream.bind); on every ask we wait for that tensor's reads. Before the first wait the cache
  decides the batch's evictions (the policy's bookkeeping then runs while the reads are in flight, not
  before they start; in decode on the evictor's helper thread, harness.engine.cache.evictor) and the evicted slices'
  pages are released off the compute thread (harness.engine.stream.account).
  Non-last expert matmuls of a layer (gate, up) are isolated too, so the last one's reads (down) overlap their
  compute.
- dense weights rebound to anonymous copies: harness.engine.stream.dense_stage; taps: harness.engine.stream.taps;
  the compiled front that answers the other asks: harness.engine.stream.front.
An exception in a ctypes callback would be swallowed and the graph silently cut short, so everything
is caught, recorded, the graph is aborted, and the session raises it after llama_decode returns.

This module is the callback dispatch and what the stages share; each stage is a base class of `StreamHook` in its
own module (bind <- account <- route; dense_stage, taps), calling only the stages below it, and keeps its own state
in one object (harness.engine.stream.state: `binds`, `releases`, `accounts`, `early`, `routing`, `dense_scan`,
`tapping`, `hidden`).
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

from harness.engine.cache.evictor import Evictor
from harness.engine.cache.expert_cache import ExpertCache
from harness.engine.io.reader import ExpertReader
from harness.engine.io.release import BATCH_LAYERS, PageReleaser
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
from harness.engine.stream.account import release_all
from harness.engine.stream.common import Bound, HookError, RouteEvent, Tap, TokenCounters
from harness.engine.stream.front import FILTER_VERSION, FILTER_VERSION_WEIGHTS, GET_ROWS_VERSION, STALE, load_filter
from harness.engine.stream.route import RouteStage
from harness.engine.stream.state import (
    AccountState,
    BindState,
    DenseScan,
    EarlyState,
    HiddenClock,
    ReleaseState,
    RouteState,
    TapState,
)
from harness.engine.stream.taps import TapStage
from harness.engine.stream.weights import PREFIX as WEIGHTS_PREFIX
from harness.engine.stream.weights import WeightsStage, is_final_weights

if TYPE_CHECKING:
    from harness.engine.cache.prefetch import Prefetcher
    from harness.engine.io.dense import AnonDense
    from harness.engine.io.recycle import PagePool
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
    def __init__(self, layout: ModelLayout, cache: ExpertCache | None, reader: ExpertReader | None,
                 record_routes: bool = False, preload: bool = False, use_c_filter: bool = True,
                 replay: RouteReplay | None = None, dense: AnonDense | None = None,
                 drop: DropRule | None = None, drop_replay: DropReplay | None = None,
                 prefetch: Prefetcher | None = None, tracing: Tracing | None = None,
                 route_ahead: RouteAhead | None = None, evict_thread: bool = False, pool: PagePool | None = None):
        # what every stage shares, and what the rest of the engine reads
        self.layout = layout
        self.tracing = tracing  # --io-trace / --compute-trace (harness.engine.io.tracing); None: no cost
        self._iotrace = tracing.io if tracing is not None else None
        self._ctrace = tracing.compute if tracing is not None else None
        self.cache = cache
        self.reader = reader
        self.prefetch = prefetch
        self.route_ahead = route_ahead
        self.drop = drop  # --drop-cold-experts: the rule
        self.error: BaseException | None = None
        self.counters = TokenCounters()
        self.k_effective: int | None = None
        self.phase = 0  # set by the generation driver (run/token_loop.py, run/fidelity.py): 0 prefill, 1 decode
        self.decode_index = -1
        self.taps: list[Tap] = []  # called with each layer's MoE input (see the module docstring)
        want_weights = record_routes or drop is not None or drop_replay is not None
        self.stage = WeightsStage(drop, drop_replay) if want_weights else None  # the router weights (weights.py)
        # each stage's own state (state.py)
        # no cache: every layer's tensors of a kind share one buffer whose pages are reused every token
        shared = cache is not None and not cache.enabled and reader is not None and not preload
        self.binds = BindState(shared, layout.row.expert_tensors[-1])  # the row lists them in graph order: down last
        # evicted slices' pages, released off the compute thread (to the page pool with --recycle-pages), in batches
        # of a few layers (release.BATCH_LAYERS)
        self.releases = ReleaseState(PageReleaser(release_all, every=BATCH_LAYERS))
        self.binds.pool = pool
        # decode evictions on a helper thread (harness.engine.cache.evictor), where nothing else reads the cache
        # between a batch's first expert matmul and the next layer's lookups: not with read-ahead (it admits right
        # after the evictions), route-ahead (held batches) or router weights (drops read the residency)
        evictor = (Evictor() if evict_thread and cache is not None and cache.enabled and reader is not None
                   and prefetch is None and route_ahead is None and not want_weights else None)
        self.accounts = AccountState(preload, evictor, record_routes)
        early = route_ahead is not None and cache is not None and cache.enabled and reader is not None and not shared
        self.early = EarlyState({} if early else None)
        self.routing = RouteState((layout.row.topk_node + "-").encode(), replay, min(layout.by_layer))
        self.dense_scan = DenseScan(dense, dense is not None)  # --dense-weights anon: rebind on first sight
        self.tapping = TapState()
        self.hidden = HiddenClock()
        if route_ahead is not None:
            self.taps.append(route_ahead.tap)
            if early:
                route_ahead.on_commit = self._commit_early
        from llama_cpp import llama_cpp as L

        cb = self._callback if self._ctrace is None else self._ctrace.wrap(self._callback)
        self.py_cfunc = L.ggml_backend_sched_eval_callback(cb)
        self.cfunc = self.py_cfunc
        self.user_data: int | None = None
        self.front = "python"
        get_rows = bool(layout.token_routed_layers)
        self._filter = (load_filter(self.py_cfunc, self.routing.topk_prefix, self.dense_scan.active, get_rows,
                                    want_weights) if use_c_filter else None)
        self.front_note = ""
        if self._filter == STALE:
            self._filter = None
            needs = ("token-id routed layers" if get_rows else
                     "route weights or drops" if want_weights else "--dense-weights anon")
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
                if self.dense_scan.active:
                    self._scan_dense(t)
                op = _c_int.from_address(t + OFF_OP).value
                if op == GGML_OP_MUL_MAT_ID:
                    st = self.stage
                    if st is not None and st.pending is not None:  # the layer's first expert matmul
                        self._finish_weights()
                    if self.tapping.due is not None:
                        self._run_taps(t)
                    if self.cache is None:
                        return False  # replay-only run (mmap baseline): experts stay in the file mapping
                    src = _c_vp.from_address(t + OFF_SRC0).value
                    bs = self.binds
                    b = bs.bound.get(src, 0)
                    if b == 0:
                        b = self._bind(src)
                    if b is None:
                        return False
                    if self.accounts.evict_due or (self.prefetch is not None and self.prefetch.planned):
                        self._evict_now(True)  # the last batch's reads are in flight now: decide evictions meanwhile
                    inflight, spec_wait = bs.inflight, bs.spec_wait
                    futs = inflight.pop(src, None)
                    if futs:
                        self._wait(futs)
                    if spec_wait:
                        futs = spec_wait.pop(src, None)
                        if futs:
                            self._wait(futs, count=False)  # the prefetcher counts its own reads
                    # isolate gate/up only while the layer's down slices are still being read, so those
                    # reads overlap gate/up compute; with nothing in flight, no extra graph split
                    down = bs.last_addr.get(b.et.layer, 0)
                    return b.isolate and bool(inflight.get(down) or spec_wait.get(down))
                if op == GGML_OP_VIEW or op == GGML_OP_TOP_K or op == GGML_OP_GET_ROWS:
                    if _string_at(t + OFF_NAME, 20).startswith(self.routing.topk_prefix):
                        return True
                if self.stage is not None:
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
        r, self.accounts.routes = self.accounts.routes, []
        return r

    def take_counters(self) -> TokenCounters:
        self._join_evict()
        if self.accounts.evict_due:  # settle the last batch's evictions (normally done at its first wait)
            self._evict_now()
        if self.prefetch is not None:
            p, c = self.prefetch.take(), self.counters
            c.read_bytes += p.read_bytes
            c.io_ns += p.io_ns
            c.prefetch_bytes, c.prefetch_used_bytes, c.prefetch_wasted_bytes = (p.prefetch_bytes, p.used_bytes,
                                                                                p.wasted_bytes)
        self.releases.releaser.flush()  # the token's last evictions go now, not with the next token's
        c, self.counters = self.counters, TokenCounters()
        releases, self.releases.recent = self.releases.recent, []
        for f in releases:  # an eviction that failed must not pass silently
            if f.done() and f.exception() is not None:
                raise HookError(f"evicting expert pages failed: {f.exception()}")
        return c

    def close(self) -> None:
        if self.accounts.evictor is not None:
            self.accounts.evictor.close()
        self.releases.releaser.close()

    def raise_if_failed(self) -> None:
        if self.error is not None:
            e, self.error = self.error, None
            if isinstance(e, KeyboardInterrupt):  # Ctrl-C landed inside the callback: the user's interrupt
                raise KeyboardInterrupt
            raise HookError(f"streaming hook failed: {type(e).__name__}: {e}") from e
