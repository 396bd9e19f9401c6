"""The hook's accounting stage: a layer batch's cache lookups, the reads of its misses, its evictions and the
release of the evicted slices' pages.

- a layer batch (`_account`): its cache lookups and the reads of its misses; its evictions are decided later,
  at the first expert-matmul ask (`_evict_now`; in decode on the evictor's thread, joined before the next
  lookups), and the evicted slices' pages released off the compute thread (`_release`).
- with `--prefetch K` / `--predict-prefetch` (a `prefetch.Prefetcher`), each layer's routing names experts of the
  next layers to read speculatively; they are admitted to the cache and read right after the batch's evictions
  are decided (`_evict_now`), on lanes with no demand work; a batch that hits one waits for its reads
  (`spec_wait`) instead of reading again, and an evicted one's page release waits for a read still running.
- with `--route-ahead N` and a cache, the committed layer is accounted and its misses read at commit time
  (`_commit_early`); the policies protect only the last batch, so an entry evicted while its layer is accounted
  and not yet computed (`_held`) keeps its pages until that layer has been computed (a few slices over the budget
  for a few layers); without one (shared slots, which hold one layer at a time) its reads start at its own routing
  node as usual.

A stage of `StreamHook` (harness.engine.stream.hook); its own state is one object (harness.engine.stream.state), and
this class names what else of the hook the stage uses.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np

from harness.engine.io.read_group import wait_done
from harness.engine.stream.bind import BindStage
from harness.engine.stream.common import Bound, RouteEvent, settle

if TYPE_CHECKING:
    from harness.engine.cache.expert_cache import ExpertCache
    from harness.engine.cache.prefetch import Prefetcher
    from harness.engine.stream.state import AccountState, EarlyState, ReleaseState

_perf_ns, _thread_ns = time.perf_counter_ns, time.thread_time_ns


def _release_slices(e: int, bounds: tuple[Bound, ...], after: list[Future] | None = None) -> None:
    if after:  # a speculative read still writing into the slices
        wait_done(after)
    for b in bounds:
        pos = b.et.abs_offset + e * b.et.nb2
        b.res.release(pos, pos + b.et.nb2)


def release_all(work: list[tuple[tuple[int, int], tuple[Bound, ...], list[Future] | None]]) -> None:
    for key, bounds, after in work:
        _release_slices(key[1], bounds, after)


class AccountStage(BindStage):
    cache: ExpertCache | None
    prefetch: Prefetcher | None
    phase: int
    accounts: AccountState  # this stage's own
    releases: ReleaseState  # the page release of what it evicts
    early: EarlyState  # route-ahead's layers accounted at commit time

    @property
    def early_reads(self) -> bool:
        """Route-ahead reads a committed layer's misses at commit time (a cache), not at its routing node."""
        return self.early.held is not None

    def _commit_early(self, il: int, ids: np.ndarray) -> None:
        """Route-ahead with a cache: layer `il`'s committed batch is accounted and its misses read now."""
        self.early.layers.add(il)
        self._account(il, ids.reshape(-1).tolist(), ids)

    def _account(self, il: int, flat_ids: list[int], ids: np.ndarray | None) -> RouteEvent | None:
        """The layer batch's cache lookups and reads (flat_ids: the experts to compute, in routing order; not
        modified)."""
        acc, bs = self.accounts, self.binds
        if acc.evictor is not None:
            self._join_evict()
        cache = self.cache
        assert cache is not None
        preloaded: list[int] = []
        if acc.preload and il not in acc.preloaded:
            acc.preloaded.add(il)
            preloaded = cache.preload(il, range(self.layout.n_expert))
        if acc.evict_due:
            self._evict_now()
        # duplicates only promote, inside the cache; evictions are decided later (_evict_now), while this
        # batch's reads are in flight, so the policy's bookkeeping overlaps I/O instead of delaying it
        res = cache.lookup_batch(il, flat_ids, evict=False)
        acc.evict_due = cache.enabled
        hits, misses = res.hits, res.misses
        held = self.early.held
        if held is not None:  # route-ahead: this batch's slices stay until the layer is computed
            held[il] = {(il, e) for e in flat_ids}
        c = self.counters
        c.lookups += len(hits) + len(misses)  # the unique experts, each a hit or a miss
        c.hits += len(hits)
        if preloaded:
            res.misses = misses = sorted(set(preloaded) | set(misses))
        if res.evicted and not bs.shared:  # shared slots: the previous batch's slices are simply overwritten
            self._release(res.evicted)  # no cache: the previous batch
        if misses:
            rel = self.releases
            pending_release = rel.pending
            for e in misses:
                f = pending_release.pop((il, e), None)
                if f is not None:
                    rel.releaser.wait(f)
            bounds = bs.layer_bound.get(il)
            if bounds:
                self._submit_layer(bounds, misses)
        if il not in acc.bound_all:
            if len(bs.layer_bound.get(il, ())) < len(self.layout.by_layer[il]):
                bs.pending[il] = misses  # some tensors of this layer not bound yet (first pass)
            else:  # bound for good: nothing pending from now on
                acc.bound_all.add(il)
                bs.pending.pop(il, None)
        if self.prefetch is not None:
            order = list(dict.fromkeys(flat_ids))  # unique, in order of first appearance
            last = order if ids is None or len(ids) == 1 else list(dict.fromkeys(ids[-1].tolist()))
            spec_wait = bs.spec_wait
            for addr, f in self.prefetch.on_routed(il, hits, last, self.phase == 1):
                spec_wait.setdefault(addr, []).append(f)
        if acc.record_routes and ids is not None:
            hit = set(hits)
            ev = RouteEvent(self.phase, il, ids, {e: int(e in hit) for e in dict.fromkeys(flat_ids)})
            acc.routes.append(ev)
            return ev
        return None

    def _evict_now(self, off_thread: bool = False) -> None:
        """The last batch's evictions; `off_thread` (at its first expert-matmul ask only): in decode, on the
        evictor's thread while the layer computes, joined before the cache is read again (_join_evict)."""
        t0, c0 = _perf_ns(), _thread_ns()
        acc = self.accounts
        ev = acc.evictor
        if off_thread and ev is not None and self.phase == 1:
            acc.evict_due = False
            ev.submit(self._evict_job)
            settle(self.counters, t0, c0)
            return
        beside = bool(self.binds.inflight)  # demand reads in flight: this runs beside them
        acc.evict_due = False
        self._release(self.cache.evict_over_budget())
        if self.prefetch is not None and self.prefetch.planned:  # after the batch's evictions: read what stays
            self._release(self.prefetch.admit(self.binds.layer_bound, self.releases.pending))
        t1 = settle(self.counters, t0, c0)
        if beside:
            self.hidden.ns += t1 - t0

    def _evict_job(self) -> None:
        """On the evictor's thread (harness.engine.cache.evictor): the batch's evictions and their page release."""
        self._release(self.cache.evict_over_budget())

    def _join_evict(self) -> None:
        """Before the cache is read again: the evictor's decision is in (its CPU counted as mgmt_bg_cpu_ns)."""
        ev = self.accounts.evictor
        if ev is not None and ev.pending:
            self.counters.mgmt_bg_cpu_ns += ev.join()

    def _release(self, evicted: list[tuple[int, int]]) -> None:
        # their pages released off the compute thread, one task per batch of evictions (one submit, not one per
        # entry); a later re-read of a key waits for its task; a speculative read still writing into an evicted
        # entry's slices is waited for first (prefetch)
        if not evicted:
            return
        rel = self.releases
        pf, held, of_layer = self.prefetch, self.early.held, rel.bounds
        work = []
        nbytes = 0
        for key in evicted:
            if held and key in held.get(key[0], ()):  # route-ahead: its layer still computes with it; later
                self.early.deferred.setdefault(key[0], []).append(key)
                continue
            after = pf.on_evicted(key) if pf is not None else None
            lb = of_layer.get(key[0]) or self._layer_release_bounds(key[0])
            if lb[0]:
                work.append((key, lb[0], after))
                nbytes += lb[1]
        if work:
            f = rel.releaser.add(work, nbytes)
            pending_release = rel.pending
            for w in work:
                pending_release[w[0]] = f
            recent = rel.recent
            if not recent or recent[-1] is not f:
                recent.append(f)

    def _layer_release_bounds(self, il: int) -> tuple[tuple[Bound, ...], int]:
        """Layer `il`'s bound tensors and the bytes of one expert's slices in them; kept once all are bound."""
        bounds = tuple(self.binds.layer_bound.get(il, ()))
        lb = (bounds, sum(b.et.nb2 for b in bounds))
        if len(bounds) == len(self.layout.by_layer[il]):
            self.releases.bounds[il] = lb
        return lb
