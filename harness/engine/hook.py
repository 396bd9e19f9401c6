"""The router hook on llama.cpp's `cb_eval`: routed experts are read from flash when a token needs them.

Contract (ggml_backend_sched with an eval callback): for each graph node the scheduler first asks
(`ask=True`); a True answer ends the current group, which is computed and synchronised, and the node is
then passed again with `ask=False`. So:
- `ffn_moe_topk-<il>` (a VIEW of the argsort, a TOP_K, or a GET_ROWS where an architecture selects by token id,
  as deepseek4's hash-routed layers do) is isolated (True on ask); in its non-ask call the selected ids are
  materialised: the cache accounts the layer batch and reads for the misses go to the lanes.
- a MUL_MAT_ID node whose src[0] is a routed-expert tensor: on its first ask the tensor's data pointer
  is rebound to an anonymous reservation (asks run before compute, so nothing is ever faulted in through
  the file mapping); on every ask we wait for that tensor's reads. Before the first wait the cache
  decides the batch's evictions (the policy's bookkeeping then runs while the reads are in flight, not
  before they start) and the evicted slices are dropped off the compute thread. Non-last expert matmuls of a layer
  (gate, up) are isolated too, so the last one's reads (down) overlap their compute. Without a cache, every
  layer's tensor of one kind is placed in one shared buffer (`vm.SharedSlot`): the topk node of layer L+1 is
  computed only after layer L's matmuls, so its reads can never overwrite slices still in use, and the buffer's
  pages are reused every token instead of being faulted (zeroed, charged) and released again.
- with `--drop-cold-experts` (a `drop.DropRule`), a `--drop-replay` (a `drop.DropReplay`) or a route trace,
  the router's final weights node (`ffn_moe_weights`, `_softmax`, `_norm`, `_scaled`: the last one computed is
  the one the expert outputs are multiplied by) is isolated too; at the layer's first expert-matmul ask the
  weights are read (the trace's weight column) and, where drops apply, the layer batch's cache accounting
  and reads wait until then: the dropped slots' weights are zeroed (the kept ones renormalised) and their
  ids pointed at a kept expert, so nothing reads the dropped slices (harness.engine.drop).
- with `--dense-weights anon` (a `dense.AnonDense`), every ask of the first graphs (prefill and the first
  decode; later decodes reuse that graph) is scanned: each source that is a dense weight is rebound to its
  anonymous copy on first sight, before compute, and a view still pointing into its old pages is moved
  along. The C front forwards every ask while that scan lasts (`forward_all`), then only the usual ones.
- with `--prefetch K` / `--predict-prefetch` (a `prefetch.Prefetcher`), each layer's routing names experts of the
  next layers to read speculatively; they are admitted to the cache and read right after the batch's evictions
  are decided (`_evict_now`), on lanes with no demand work; a batch that hits one waits for its reads
  (`spec_wait`) instead of reading again, and an evicted one's page drop waits for a read still running.
- taps (`StreamHook.taps`, empty = no cost): at the first expert-matmul ask of each layer in a graph, the
  MUL_MAT_ID's src[1] (a reshape view of the layer's MoE input, an ancestor of the routing node, so computed and
  valid by then) is copied out as float32 [n_tok, n_embd] and every tap is called with
  (layer, phase, decode_index, hidden): the early router's input (route-ahead, predictive prefetch).
- with `--route-ahead N` (a `route_ahead.RouteAhead`, one of the taps): a decode layer's routing committed N MoE
  layers early overwrites the selected ids at its routing node. With a cache, the committed layer is accounted
  and its misses read at commit time (`_commit_early`); the policies protect only the last batch, so an entry
  evicted while its layer is accounted and not yet computed (`_held`) keeps its pages until that layer has been
  computed (a few slices over the budget for a few layers); without one (shared slots, which hold one layer at a
  time) its reads start at its own routing node as usual.
An exception in a ctypes callback would be swallowed and the graph silently cut short, so everything
is caught, recorded, the graph is aborted, and the session raises it after llama_decode returns.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from harness.engine.cache import ExpertCache
from harness.engine.drop_stage import PREFIX as WEIGHTS_PREFIX
from harness.engine.drop_stage import WeightsStage, is_final_weights
from harness.engine.ggml import (
    GGML_MAX_SRC,
    GGML_OP_GET_ROWS,
    GGML_OP_MUL_MAT_ID,
    GGML_OP_TOP_K,
    GGML_OP_VIEW,
    GGML_TYPE_F32,
    GGML_TYPE_I32,
    OFF_DATA,
    OFF_NAME,
    OFF_OP,
    OFF_SRC0,
    OFF_VIEW_OFFS,
    OFF_VIEW_SRC,
    tensor_at,
)
from harness.engine.gguf_layout import ExpertTensor, ModelLayout
from harness.engine.read_group import wait_done
from harness.engine.reader import ExpertReader
from harness.engine.vm import Reservation, SharedSlot

if TYPE_CHECKING:
    from harness.engine.dense import AnonDense
    from harness.engine.drop import DropReplay, DropRule
    from harness.engine.prefetch import Prefetcher
    from harness.engine.route_ahead import RouteAhead
    from harness.engine.route_replay import RouteReplay
    from harness.engine.tracing import Tracing

_c_int = ctypes.c_int
_c_vp = ctypes.c_void_p
_c_size = ctypes.c_size_t
_Srcs = ctypes.c_void_p * GGML_MAX_SRC
FILTER_VERSION = 2  # cfilter.c's bmoe_filter_version(): 2 has forward_all
GET_ROWS_VERSION = 4  # 4 also isolates a GET_ROWS top-k node (selection by token id)
FILTER_VERSION_WEIGHTS = 4  # 4 also forwards the router-weights nodes (wprefix)
STALE = "stale"  # load_filter: the built library is older than this file needs
_string_at = ctypes.string_at
# tap(layer, phase, decode_index, hidden float32 [n_tok, n_embd]): a layer's MoE input, at its first expert matmul
Tap = Callable[[int, int, int, np.ndarray], None]


@dataclass
class Bound:
    addr: int  # the model tensor's address
    et: ExpertTensor
    res: Reservation
    isolate: bool  # answer True on its ask (not the last expert matmul of its layer)


@dataclass
class TokenCounters:
    stall_ns: int = 0
    mgmt_ns: int = 0
    io_ns: int = 0
    read_bytes: int = 0
    lookups: int = 0
    hits: int = 0
    prefetch_bytes: int = -1  # with a Prefetcher: its counts for the token (prefetch.PrefetchCounts)
    prefetch_used_bytes: int = -1
    prefetch_wasted_bytes: int = -1


@dataclass
class RouteEvent:
    phase: int
    layer: int
    ids: np.ndarray  # [n_tokens, k]
    residency: dict[int, int] = field(default_factory=dict)  # expert -> 0 miss / 1 hit
    weights: np.ndarray | None = None  # [n_tokens, k] the router's weights, before any drop
    dropped: np.ndarray | None = None  # [n_tokens, k] bool


class HookError(RuntimeError):
    pass


def _drop_slices(e: int, bounds: tuple[Bound, ...], after: list[Future] | None = None) -> None:
    if after:  # a speculative read still writing into the slices
        wait_done(after)
    for b in bounds:
        pos = b.et.abs_offset + e * b.et.nb2
        b.res.drop(pos, pos + b.et.nb2)


def _drop_all(work: list[tuple[tuple[int, int], tuple[Bound, ...], list[Future] | None]]) -> None:
    for key, bounds, after in work:
        _drop_slices(key[1], bounds, after)


class _Filter(ctypes.Structure):
    _fields_ = [("py", ctypes.c_void_p), ("off_op", ctypes.c_int64), ("off_name", ctypes.c_int64),
                ("op_mul_mat_id", ctypes.c_int32), ("op_view", ctypes.c_int32), ("op_top_k", ctypes.c_int32),
                ("prefix_len", ctypes.c_int32), ("prefix", ctypes.c_char * 32), ("asks", ctypes.c_int64),
                ("forwarded", ctypes.c_int64), ("forward_all", ctypes.c_int32), ("op_get_rows", ctypes.c_int32),
                ("wprefix_len", ctypes.c_int32), ("wprefix", ctypes.c_char * 32)]


def load_filter(py_cfunc, prefix: bytes, forward_all: bool = False, get_rows_topk: bool = False,
                weights: bool = False):
    """The compiled C front (cfilter.c), or None when it was not built (then Python answers every ask), or
    STALE when `forward_all`, a GET_ROWS top-k node or `weights` (forward the router-weights nodes) is needed
    and the built library predates it."""
    import glob
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "_cfilter*.so")))
    if not found:
        return None
    lib = ctypes.CDLL(found[0])
    lib.bmoe_filter_cb.restype = ctypes.c_bool
    version = lib.bmoe_filter_version() if hasattr(lib, "bmoe_filter_version") else 1
    if ((forward_all and version < FILTER_VERSION) or (get_rows_topk and version < GET_ROWS_VERSION)
            or (weights and version < FILTER_VERSION_WEIGHTS)):
        return STALE
    f = _Filter()
    f.py = ctypes.cast(py_cfunc, ctypes.c_void_p).value
    f.off_op, f.off_name = OFF_OP, OFF_NAME
    f.op_mul_mat_id, f.op_view, f.op_top_k = GGML_OP_MUL_MAT_ID, GGML_OP_VIEW, GGML_OP_TOP_K
    f.prefix_len = len(prefix)
    f.prefix = prefix
    f.forward_all = int(forward_all)
    f.op_get_rows = GGML_OP_GET_ROWS if version >= GET_ROWS_VERSION else -1
    if weights:
        f.wprefix_len = len(WEIGHTS_PREFIX)
        f.wprefix = WEIGHTS_PREFIX
    return lib, f


class StreamHook:
    NOT_EXPERT = None

    def __init__(self, layout: ModelLayout, cache: ExpertCache | None, reader: ExpertReader | None,
                 record_routes: bool = False, preload: bool = False, use_c_filter: bool = True,
                 replay: RouteReplay | None = None, dense: AnonDense | None = None,
                 drop: DropRule | None = None, drop_replay: DropReplay | None = None,
                 prefetch: Prefetcher | None = None, tracing: Tracing | None = None,
                 route_ahead: RouteAhead | None = None):
        self.layout = layout
        self.tracing = tracing  # --io-trace / --compute-trace (harness.engine.tracing); None: no cost
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
        self.dropper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bmoe-evict")
        self.pending_drop: dict[tuple[int, int], Future] = {}
        self._recent_drops: list[Future] = []
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
        self._preloaded: set[int] = set()
        self._evict_due = False  # the last batch's evictions are still to be decided
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
                        self._evict_now()  # the last batch's reads are in flight now: decide evictions meanwhile
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

    # -- pieces ---------------------------------------------------------------------------------
    def _scan_dense(self, t: int) -> None:
        t0 = time.perf_counter_ns()
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
        self.counters.mgmt_ns += time.perf_counter_ns() - t0

    def _end_dense_scan(self) -> None:
        """The graph is built and reused from here on: stop scanning, free the copies never bound."""
        self._dense_scan = False
        if self._filter is not None:
            self._filter[1].forward_all = 0
        if self.dense is not None:
            self.dense.finish()

    def _bind(self, src: int) -> Bound | None:
        name = _string_at(src + OFF_NAME).decode()
        et = self.layout.experts.get(name)
        if et is None:
            self.bound[src] = None
            return None
        if et.layer not in self._routed:
            raise HookError(
                f"{name}: an expert matmul with no '{self.layout.row.topk_node}-{et.layer}' routing node before it; "
                f"'{self.layout.arch}' does not route through llama.cpp's standard MoE builder, so it needs a row "
                "of its own in the registry")
        t0 = time.perf_counter_ns()
        tt = tensor_at(src)
        shape = tuple(int(tt.ne[i]) for i in range(len(et.shape)))
        if shape != et.shape or int(tt.nb[2]) != et.nb2 or int(tt.type) != et.ggml_type:
            raise HookError(
                f"{name}: graph tensor shape {shape} nb2 {int(tt.nb[2])} type {int(tt.type)} does not match the "
                f"GGUF ({et.shape}, {et.nb2}, {et.ggml_type}); was the model loaded with weight repacking?")
        res = self._slot(et.kind).view(et.nbytes, et.abs_offset) if self.shared else \
            Reservation(et.nbytes, et.abs_offset)
        old = int(tt.data or 0)
        _c_vp.from_address(src + OFF_DATA).value = res.data
        if old and self.reader is not None:
            self.reader.release_mapped(et.path, et.abs_offset, et.nbytes, old)
        b = Bound(src, et, res, isolate=et.kind != self._last_kind)
        if not b.isolate:
            self.last_addr[et.layer] = src
        self.bound[src] = b
        self.layer_bound.setdefault(et.layer, []).append(b)
        misses = self.pending.get(et.layer)
        if misses:
            self.inflight[src] = [self._submit_many(b, misses)]
        self.counters.mgmt_ns += time.perf_counter_ns() - t0
        return b

    def _slot(self, kind: str) -> SharedSlot:
        if kind not in self._slots:
            self._slots[kind] = SharedSlot(max(t.nbytes for t in self.layout.experts.values() if t.kind == kind))
        return self._slots[kind]

    def _submit_many(self, b: Bound, experts: list[int]) -> Future:
        """One call for a tensor's missed slices (reader.submit_many), not one submit per slice."""
        et, tr = b.et, self._iotrace
        nb2, off, addr_of = et.nb2, et.abs_offset, b.res.addr_of
        if tr is None:
            reads = [(p, nb2, addr_of(p), None) for p in [off + e * nb2 for e in experts]]
        else:
            reads = [(off + e * nb2, nb2, addr_of(off + e * nb2), tr.record(et.layer, e, et.kind, off + e * nb2, nb2))
                     for e in experts]
        return self.reader.submit_many(et.path, reads)

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
        if self._ctrace is not None:
            self._ctrace.wait(t0, t1)

    def _on_topk(self, t: int) -> None:
        t0 = time.perf_counter_ns()
        tt = tensor_at(t)
        name = tt.name.decode()
        il = int(name[len(self.topk_prefix):])
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
        if tt.type != GGML_TYPE_I32:
            raise HookError(f"{name}: expected I32 expert ids, got ggml type {tt.type}")
        k, n_tok, nb1 = int(tt.ne[0]), int(tt.ne[1]), int(tt.nb[1])
        self.k_effective = k
        if self.phase == 1 and il == self._first_moe_layer:
            self.decode_index += 1
            if self._dense_scan and self.decode_index >= 1:
                self._end_dense_scan()
        n_exp = self.layout.n_expert
        ids = view = None
        if n_tok == 1 and self.replay is None and not self._want_weights and ahead is None:
            flat_ids = list((ctypes.c_int32 * k).from_address(tt.data))  # decode fast path: no numpy
            lo, hi = min(flat_ids), max(flat_ids)
        else:
            stride = nb1 // 4
            buf = (ctypes.c_int32 * (stride * (n_tok - 1) + k)).from_address(tt.data)
            view = np.lib.stride_tricks.as_strided(np.frombuffer(buf, dtype=np.int32), shape=(n_tok, k),
                                                   strides=(nb1, 4))
            if self.replay is not None:
                forced = self.replay.ids(il, self.phase, n_tok, self.decode_index)
                if forced is not None:
                    view[:, :] = forced  # before anything reads them: weights and matmuls follow the trace
            if ahead is not None:
                if ahead.shape != view.shape:
                    raise HookError(f"{name}: routed ahead {ahead.shape} ids, the graph selects {view.shape}")
                self.route_ahead.score(ahead, view)
                view[:, :] = ahead  # the committed routing, before the weights and the matmuls read the ids
            ids = view.copy()
            flat_ids = ids.reshape(-1).tolist()
            lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= n_exp:
            raise HookError(f"{name}: expert id out of range 0..{n_exp - 1}: {lo}..{hi}")
        st = self.stage
        if st is not None:
            assert ids is not None and view is not None
            if st.on_topk(il, self.phase, view, ids):  # lookups and reads wait for the drops (_finish_weights)
                self.counters.mgmt_ns += time.perf_counter_ns() - t0
                return
        if self.cache is None or il in self._early:  # resident, or accounted and read at commit time
            self._early.discard(il)
            self.counters.mgmt_ns += time.perf_counter_ns() - t0
            return
        ev = self._account(il, flat_ids, ids)
        if st is not None and st.pending is not None:
            st.pending.event = ev
        self.counters.mgmt_ns += time.perf_counter_ns() - t0

    @property
    def early_reads(self) -> bool:
        """Route-ahead reads a committed layer's misses at commit time (a cache), not at its routing node."""
        return self._held is not None

    def _commit_early(self, il: int, ids: np.ndarray) -> None:
        """Route-ahead with a cache: layer `il`'s committed batch is accounted and its misses read now."""
        self._early.add(il)
        self._account(il, ids.reshape(-1).tolist(), ids)

    def _run_taps(self, t: int) -> None:
        """The layer's first expert-matmul ask: hand its MoE input (src[1]) to every tap."""
        t0 = time.perf_counter_ns()
        il, self._tap_due = self._tap_due, None
        assert il is not None
        src0 = _c_vp.from_address(t + OFF_SRC0).value
        if not _string_at(src0 + OFF_NAME, 24).startswith(f"blk.{il}.".encode()):
            raise HookError(f"the first expert matmul after '{self.layout.row.topk_node}-{il}' is "
                            f"{_string_at(src0 + OFF_NAME).decode()!r}, not one of layer {il}")
        x = tensor_at(_Srcs.from_address(t + OFF_SRC0)[1])
        if int(x.type) != GGML_TYPE_F32 or int(x.ne[1]) != 1 or int(x.nb[0]) != 4:
            self.tap_skipped.add(il)  # e.g. llama4 multiplies the router weights in first: not the MoE input
            self.counters.mgmt_ns += time.perf_counter_ns() - t0
            return
        n_embd, n_tok, nb2 = int(x.ne[0]), int(x.ne[2]) * int(x.ne[3]), int(x.nb[2])
        buf = (ctypes.c_float * ((n_tok - 1) * (nb2 // 4) + n_embd)).from_address(x.data)
        hidden = np.lib.stride_tricks.as_strided(np.frombuffer(buf, dtype=np.float32), shape=(n_tok, n_embd),
                                                 strides=(nb2, 4)).copy()
        for tap in self.taps:
            tap(il, self.phase, self.decode_index, hidden)
        self.counters.mgmt_ns += time.perf_counter_ns() - t0

    @property
    def drop_totals(self) -> list[int]:
        """Decode slots, decode slots dropped, prefill slots, prefill slots dropped (where drops applied)."""
        return self.stage.totals if self.stage is not None else [0, 0, 0, 0]

    def _finish_weights(self) -> None:
        """At the layer's first expert-matmul ask: the router weights are computed. Read them (route traces),
        apply the drops (harness.engine.drop_stage), then account the kept experts."""
        t0 = time.perf_counter_ns()
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
        self.counters.mgmt_ns += time.perf_counter_ns() - t0

    def _account(self, il: int, flat_ids: list[int], ids: np.ndarray | None) -> RouteEvent | None:
        """The layer batch's cache lookups and reads (flat_ids: the experts to compute, in routing order)."""
        assert self.cache is not None
        n_exp = self.layout.n_expert
        order = list(dict.fromkeys(flat_ids))  # unique, in order of first appearance
        preloaded: list[int] = []
        if self.preload and il not in self._preloaded:
            self._preloaded.add(il)
            preloaded = self.cache.preload(il, range(n_exp))
        if self._evict_due:
            self._evict_now()
        # duplicates only promote, inside the cache; evictions are decided later (_evict_now), while this
        # batch's reads are in flight, so the policy's bookkeeping overlaps I/O instead of delaying it
        res = self.cache.lookup_batch(il, flat_ids, evict=False)
        self._evict_due = self.cache.enabled
        if self._held is not None:  # route-ahead: this batch's slices stay until the layer is computed
            self._held[il] = {(il, e) for e in order}
        if preloaded:
            res.misses = sorted(set(preloaded) | set(res.misses))
        c = self.counters
        c.lookups += len(order)
        c.hits += len(res.hits)
        if not self.shared:  # shared slots: the previous batch's slices are simply overwritten
            self._drop(res.evicted)  # no cache: the previous batch
        for e in res.misses:
            f = self.pending_drop.pop((il, e), None)
            if f is not None:
                f.result()
        if res.misses:
            for b in self.layer_bound.get(il, ()):
                self.inflight.setdefault(b.addr, []).append(self._submit_many(b, res.misses))
        if len(self.layer_bound.get(il, ())) < len(self.layout.by_layer[il]):
            self.pending[il] = res.misses  # some tensors of this layer not bound yet (first pass)
        else:
            self.pending.pop(il, None)
        if self.prefetch is not None:
            last = order if ids is None or len(ids) == 1 else list(dict.fromkeys(ids[-1].tolist()))
            for addr, f in self.prefetch.on_routed(il, res.hits, last, self.phase == 1):
                self.spec_wait.setdefault(addr, []).append(f)
        if self.record_routes and ids is not None:
            hits = set(res.hits)
            ev = RouteEvent(self.phase, il, ids, {e: int(e in hits) for e in order})
            self.routes.append(ev)
            return ev
        return None

    def _evict_now(self) -> None:
        t0 = time.perf_counter_ns()
        self._evict_due = False
        self._drop(self.cache.evict_over_budget())
        if self.prefetch is not None and self.prefetch.planned:  # after the batch's evictions: read what stays
            self._drop(self.prefetch.admit(self.layer_bound, self.pending_drop))
        self.counters.mgmt_ns += time.perf_counter_ns() - t0

    def _drop(self, evicted: list[tuple[int, int]]) -> None:
        # dropped off the compute thread, one task per batch of evictions (one submit, not one per entry);
        # a later re-read of a key waits for its task; a speculative read still writing into an evicted
        # entry's slices is waited for first (prefetch)
        pf, held = self.prefetch, self._held
        work = []
        for key in evicted:
            if held and key in held.get(key[0], ()):  # route-ahead: its layer still computes with it; drop it after
                self._deferred.setdefault(key[0], []).append(key)
                continue
            after = pf.on_evicted(key) if pf is not None else None
            bounds = tuple(self.layer_bound.get(key[0], ()))
            if bounds:
                work.append((key, bounds, after))
        if work:
            f = self.dropper.submit(_drop_all, work)
            for key, _, _ in work:
                self.pending_drop[key] = f
            self._recent_drops.append(f)

    def take_routes(self) -> list[RouteEvent]:
        """The routing decisions recorded since the last call (with record_routes)."""
        r, self.routes = self.routes, []
        return r

    def take_counters(self) -> TokenCounters:
        if self._evict_due:  # settle the last batch's evictions (normally done at its first wait)
            self._evict_now()
        if self.prefetch is not None:
            p, c = self.prefetch.take(), self.counters
            c.read_bytes += p.read_bytes
            c.io_ns += p.io_ns
            c.prefetch_bytes, c.prefetch_used_bytes, c.prefetch_wasted_bytes = (p.prefetch_bytes, p.used_bytes,
                                                                                p.wasted_bytes)
        c, self.counters = self.counters, TokenCounters()
        drops, self._recent_drops = self._recent_drops, []
        for f in drops:  # an eviction that failed must not pass silently
            if f.done() and f.exception() is not None:
                raise HookError(f"evicting expert pages failed: {f.exception()}")
        return c

    def close(self) -> None:
        self.dropper.shutdown(wait=True)

    def raise_if_failed(self) -> None:
        if self.error is not None:
            e, self.error = self.error, None
            if isinstance(e, KeyboardInterrupt):  # Ctrl-C landed inside the callback: the user's interrupt
                raise KeyboardInterrupt
            raise HookError(f"streaming hook failed: {type(e).__name__}: {e}") from e
