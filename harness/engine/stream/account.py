"""The hook's accounting stage: a layer batch's cache lookups, the reads of its misses, its evictions and drops.

- a layer batch (`_account`): its cache lookups and the reads of its misses; its evictions are decided later,
  at the first expert-matmul ask (`_evict_now`; in decode on the evictor's thread, joined before the next
  lookups), and the evicted slices dropped off the compute thread (`_drop`).
- with `--prefetch K` / `--predict-prefetch` (a `prefetch.Prefetcher`), each layer's routing names experts of the
  next layers to read speculatively; they are admitted to the cache and read right after the batch's evictions
  are decided (`_evict_now`), on lanes with no demand work; a batch that hits one waits for its reads
  (`spec_wait`) instead of reading again, and an evicted one's page drop waits for a read still running.
- with `--route-ahead N` and a cache, the committed layer is accounted and its misses read at commit time
  (`_commit_early`); the policies protect only the last batch, so an entry evicted while its layer is accounted
  and not yet computed (`_held`) keeps its pages until that layer has been computed (a few slices over the budget
  for a few layers); without one (shared slots, which hold one layer at a time) its reads start at its own routing
  node as usual.

A stage of `StreamHook` (harness.engine.stream.hook), which holds the state; this class names what the stage uses.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np

from harness.engine.io.read_group import wait_done
from harness.engine.io.release import DropBatch, Dropper
from harness.engine.stream.bind import BindStage
from harness.engine.stream.common import Bound, RouteEvent, settle

if TYPE_CHECKING:
    from harness.engine.cache.evictor import Evictor
    from harness.engine.cache.expert_cache import ExpertCache
    from harness.engine.cache.prefetch import Prefetcher

_perf_ns, _thread_ns = time.perf_counter_ns, time.thread_time_ns


def _drop_slices(e: int, bounds: tuple[Bound, ...], after: list[Future] | None = None) -> None:
    if after:  # a speculative read still writing into the slices
        wait_done(after)
    for b in bounds:
        pos = b.et.abs_offset + e * b.et.nb2
        b.res.drop(pos, pos + b.et.nb2)


def drop_all(work: list[tuple[tuple[int, int], tuple[Bound, ...], list[Future] | None]]) -> None:
    for key, bounds, after in work:
        _drop_slices(key[1], bounds, after)


class AccountStage(BindStage):
    cache: ExpertCache | None
    prefetch: Prefetcher | None
    phase: int
    preload: bool
    _preloaded: set[int]
    _evict_due: bool  # the last batch's evictions are still to be decided
    evictor: Evictor | None  # decode evictions on a helper thread (None: on the compute thread)
    _held: dict[int, set[tuple[int, int]]] | None  # layer -> its batch, accounted, not computed
    _deferred: dict[int, list[tuple[int, int]]]  # layer -> entries evicted while it was held
    _early: set[int]  # layers accounted (and read) at commit time, before their routing node
    _bound_all: set[int]  # layers whose expert tensors are all bound
    _drop_bounds: dict[int, tuple[tuple[Bound, ...], int]]  # such a layer: its bounds, one expert's bytes in them
    dropper: Dropper
    pending_drop: dict[tuple[int, int], DropBatch]
    _recent_drops: list[DropBatch]
    spec_wait: dict[int, list[Future]]  # tensor address -> prefetch reads its next matmul needs
    record_routes: bool
    routes: list[RouteEvent]

    @property
    def early_reads(self) -> bool:
        """Route-ahead reads a committed layer's misses at commit time (a cache), not at its routing node."""
        return self._held is not None

    def _commit_early(self, il: int, ids: np.ndarray) -> None:
        """Route-ahead with a cache: layer `il`'s committed batch is accounted and its misses read now."""
        self._early.add(il)
        self._account(il, ids.reshape(-1).tolist(), ids)

    def _account(self, il: int, flat_ids: list[int], ids: np.ndarray | None) -> RouteEvent | None:
        """The layer batch's cache lookups and reads (flat_ids: the experts to compute, in routing order; not
        modified)."""
        if self.evictor is not None:
            self._join_evict()
        cache = self.cache
        assert cache is not None
        preloaded: list[int] = []
        if self.preload and il not in self._preloaded:
            self._preloaded.add(il)
            preloaded = cache.preload(il, range(self.layout.n_expert))
        if self._evict_due:
            self._evict_now()
        # duplicates only promote, inside the cache; evictions are decided later (_evict_now), while this
        # batch's reads are in flight, so the policy's bookkeeping overlaps I/O instead of delaying it
        res = cache.lookup_batch(il, flat_ids, evict=False)
        self._evict_due = cache.enabled
        hits, misses = res.hits, res.misses
        if self._held is not None:  # route-ahead: this batch's slices stay until the layer is computed
            self._held[il] = {(il, e) for e in flat_ids}
        c = self.counters
        c.lookups += len(hits) + len(misses)  # the unique experts, each a hit or a miss
        c.hits += len(hits)
        if preloaded:
            res.misses = misses = sorted(set(preloaded) | set(misses))
        if res.evicted and not self.shared:  # shared slots: the previous batch's slices are simply overwritten
            self._drop(res.evicted)  # no cache: the previous batch
        if misses:
            pending_drop = self.pending_drop
            for e in misses:
                f = pending_drop.pop((il, e), None)
                if f is not None:
                    self.dropper.wait(f)
            bounds = self.layer_bound.get(il)
            if bounds:
                self._submit_layer(bounds, misses)
        if il not in self._bound_all:
            if len(self.layer_bound.get(il, ())) < len(self.layout.by_layer[il]):
                self.pending[il] = misses  # some tensors of this layer not bound yet (first pass)
            else:  # bound for good: nothing pending from now on
                self._bound_all.add(il)
                self.pending.pop(il, None)
        if self.prefetch is not None:
            order = list(dict.fromkeys(flat_ids))  # unique, in order of first appearance
            last = order if ids is None or len(ids) == 1 else list(dict.fromkeys(ids[-1].tolist()))
            for addr, f in self.prefetch.on_routed(il, hits, last, self.phase == 1):
                self.spec_wait.setdefault(addr, []).append(f)
        if self.record_routes and ids is not None:
            hit = set(hits)
            ev = RouteEvent(self.phase, il, ids, {e: int(e in hit) for e in dict.fromkeys(flat_ids)})
            self.routes.append(ev)
            return ev
        return None

    def _evict_now(self, off_thread: bool = False) -> None:
        """The last batch's evictions; `off_thread` (at its first expert-matmul ask only): in decode, on the
        evictor's thread while the layer computes, joined before the cache is read again (_join_evict)."""
        t0, c0 = _perf_ns(), _thread_ns()
        ev = self.evictor
        if off_thread and ev is not None and self.phase == 1:
            self._evict_due = False
            ev.submit(self._evict_job)
            settle(self.counters, t0, c0)
            return
        beside = bool(self.inflight)  # demand reads in flight: this runs beside them
        self._evict_due = False
        self._drop(self.cache.evict_over_budget())
        if self.prefetch is not None and self.prefetch.planned:  # after the batch's evictions: read what stays
            self._drop(self.prefetch.admit(self.layer_bound, self.pending_drop))
        t1 = settle(self.counters, t0, c0)
        if beside:
            self._hideable_ns += t1 - t0

    def _evict_job(self) -> None:
        """On the evictor's thread (harness.engine.cache.evictor): the batch's evictions and their drops."""
        self._drop(self.cache.evict_over_budget())

    def _join_evict(self) -> None:
        """Before the cache is read again: the evictor's decision is in (its CPU counted as mgmt_bg_cpu_ns)."""
        ev = self.evictor
        if ev is not None and ev.pending:
            self.counters.mgmt_bg_cpu_ns += ev.join()

    def _drop(self, evicted: list[tuple[int, int]]) -> None:
        # dropped off the compute thread, one task per batch of evictions (one submit, not one per entry);
        # a later re-read of a key waits for its task; a speculative read still writing into an evicted
        # entry's slices is waited for first (prefetch)
        if not evicted:
            return
        pf, held, of_layer = self.prefetch, self._held, self._drop_bounds
        work = []
        nbytes = 0
        for key in evicted:
            if held and key in held.get(key[0], ()):  # route-ahead: its layer still computes with it; drop it after
                self._deferred.setdefault(key[0], []).append(key)
                continue
            after = pf.on_evicted(key) if pf is not None else None
            lb = of_layer.get(key[0]) or self._layer_drop_bounds(key[0])
            if lb[0]:
                work.append((key, lb[0], after))
                nbytes += lb[1]
        if work:
            f = self.dropper.add(work, nbytes)
            pending_drop = self.pending_drop
            for w in work:
                pending_drop[w[0]] = f
            recent = self._recent_drops
            if not recent or recent[-1] is not f:
                recent.append(f)

    def _layer_drop_bounds(self, il: int) -> tuple[tuple[Bound, ...], int]:
        """Layer `il`'s bound tensors and the bytes of one expert's slices in them; kept once all are bound."""
        bounds = tuple(self.layer_bound.get(il, ()))
        lb = (bounds, sum(b.et.nb2 for b in bounds))
        if len(bounds) == len(self.layout.by_layer[il]):
            self._drop_bounds[il] = lb
        return lb
