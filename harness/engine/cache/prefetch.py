"""Lossless prefetch on idle lanes: speculative expert reads into the cache, ahead of the layer that needs them.

Which experts: `--prefetch K` names, at layer l's routing during decode, the experts most recently routed at
the next K MoE layers (the previous token's, or for layers past the last one this token's, which are the
previous token's for the next one); `--predict-prefetch` adds, at layer l's first expert matmul (a StreamHook
tap on its MoE input), what layer l+1's router run early on that input names (`tap`, at most `spec_max` of
them, best first, ahead of the history's). Candidates already resident or in flight are skipped. The
predictor's accuracy is reported as `predict_agree` (named experts the layer then used / named), and per predicted
layer as `predict_agree_l<layer>`. `--predict-min-recall R` reads a layer's names only while that layer's recall over
the run so far is at least R (after WARM_TOKENS decode tokens); the names are still made and scored, so a layer whose
recall rises is read again.

A speculative entry is told to the policy as an insert when admitted and as a hit when a lookup uses it: for LRU
that is the order a demand miss would have given; frequency policies count one use more.

How they enter the cache (`admit`, run after the batch's evictions are decided, so only entries that survive
them are read): `ExpertCache.admit` inserts each one as the policy's insert, outside any lookup (no hit or miss
is counted), evicting the policy's own victims; an entry the policy itself would evict is not read at all. The
read goes to the reader's speculative queue: it runs only on a lane with no demand work.

What happens next, per entry:
- a demand lookup finds it resident (a hit): the batch waits for its reads instead of reading again (queued ones
  are promoted to demand priority); its bytes count as *used*, once;
- its layer is routed without it while none of its reads has started: the reads are withdrawn and the entry
  taken out of the cache uncounted (*cancelled*, no bytes);
- it is evicted before any use: its bytes count as *wasted* (queued reads are cancelled; the eviction's page
  release waits for a running one, `on_evicted`).
Bytes are the layer's expert bytes (logical); `prefetch_bytes` counts the speculative reads completed, whose
physical bytes (O_DIRECT supersets) and read time join the token's read_bytes and io_ms.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from harness.engine.cache.expert_cache import ExpertCache
from harness.engine.cache.policies import Key
from harness.engine.io.reader import ExpertReader
from harness.engine.io.vm import Reservation
from harness.engine.model.gguf_layout import ExpertTensor, ModelLayout

if TYPE_CHECKING:
    from harness.engine.io.tracing import IoTrace
    from harness.engine.routing.early_router import EarlyRouter


class Bound(Protocol):
    """A routed-expert tensor rebound to its reservation (the hook's Bound)."""

    addr: int
    et: ExpertTensor
    res: Reservation

MIB = 1048576


@dataclass
class _Entry:
    reads: list[tuple[int, Future]]  # (tensor address, its read)
    nbytes: int
    rids: list[int] = field(default_factory=list)  # its reads' --io-trace rows


@dataclass
class PrefetchCounts:
    """Speculative reads since the last `take`: completed (logical and physical bytes, read ns), used, wasted."""

    prefetch_bytes: int = 0
    read_bytes: int = 0
    io_ns: int = 0
    used_bytes: int = 0
    wasted_bytes: int = 0
    cancelled: int = 0

    def add(self, o: PrefetchCounts) -> None:
        for f in ("prefetch_bytes", "read_bytes", "io_ns", "used_bytes", "wasted_bytes", "cancelled"):
            setattr(self, f, getattr(self, f) + getattr(o, f))


@dataclass
class Prefetcher:
    cache: ExpertCache
    reader: ExpertReader
    moe_layers: Sequence[int]  # in graph order
    n_tensors: dict[int, int]  # layer -> its routed-expert tensors (all must be bound before a read)
    ahead: int = 0  # --prefetch K
    router: EarlyRouter | None = None  # --predict-prefetch: the next layer's router, run early (`tap`)
    spec_max: int = 0  # --predict-spec-max N: at most N predicted experts read per layer (0 = all it names)
    last: dict[int, list[int]] = field(default_factory=dict)  # layer -> experts of the last token routed there
    planned: dict[Key, None] = field(default_factory=dict)
    entries: dict[Key, _Entry] = field(default_factory=dict)  # admitted, read issued, not used yet
    _fresh: dict[int, list[Key]] = field(default_factory=dict)  # layer -> entries admitted since its last routing
    _reads: list[tuple[Future, int]] = field(default_factory=list)  # (read, logical bytes) not harvested yet
    _tok: PrefetchCounts = field(default_factory=PrefetchCounts)  # since the last take()
    _gen: PrefetchCounts = field(default_factory=PrefetchCounts)  # since the last summary()
    _named: dict[int, list[int]] = field(default_factory=dict)  # layer -> the early router's names this token
    _agree: list[int] = field(default_factory=lambda: [0, 0])  # named experts the layer then used, named
    _agree_at: dict[int, list[int]] = field(default_factory=dict)  # the same, per predicted layer
    min_recall: float = 0.0  # --predict-min-recall: read a layer's names only while its recall so far is >= this
    _recall_run: dict[int, list[int]] = field(default_factory=dict)  # layer -> [used, named, tokens] over the run
    _gated: int = 0  # layer-tokens whose names were not read (recall under min_recall), since the last summary
    trace: IoTrace | None = None  # --io-trace: speculative rows, settled used / wasted (withdrawn: removed)

    def __post_init__(self) -> None:
        self._pos = {m: i for i, m in enumerate(self.moe_layers)}

    # -- routing -------------------------------------------------------------------------------------------
    def on_routed(self, layer: int, hits: Iterable[int], experts: list[int], decode: bool) -> list[tuple[int, Future]]:
        """Layer `layer`'s batch was looked up (`hits`: resident experts; `experts`: the last token's, unique).
        Returns the (tensor address, read) the batch must wait for: its hits still being prefetched."""
        wait: list[tuple[int, Future]] = []
        entries = self.entries
        if entries:
            for e in hits:
                ent = entries.pop((layer, e), None)
                if ent is None:
                    continue
                self._tok.used_bytes += ent.nbytes
                self._settle(ent, "used")
                for addr, f in ent.reads:  # a done one too: a failed read must raise before the compute
                    if not f.done():
                        self.reader.promote(f)
                    wait.append((addr, f))
        for key in self._fresh.pop(layer, ()):  # admitted since the layer's last routing, and not used by it:
            ent = entries.get(key)  # if nothing of it was read yet, it never will be
            if ent is not None and self.reader.withdraw([f for _, f in ent.reads]):
                del entries[key]
                self.cache.forget(key)
                self._tok.cancelled += 1
                self._settle(ent, None)
        named = self._named.pop(layer, None)
        if named is not None and decode:
            used = set(experts)
            hit = sum(e in used for e in named)
            self._agree[0] += hit
            self._agree[1] += len(named)
            per = self._agree_at.setdefault(layer, [0, 0])
            per[0] += hit
            per[1] += len(named)
            run = self._recall_run.setdefault(layer, [0, 0, 0])
            run[0] += hit
            run[1] += len(named)
            run[2] += 1
        self.last[layer] = experts
        if decode and self.ahead:
            n = len(self.moe_layers)
            i = self._pos[layer]
            for j in range(1, self.ahead + 1):
                m = self.moe_layers[(i + j) % n]
                self.plan(m, self.last.get(m, ()))
        return wait

    def plan(self, layer: int, experts: Iterable[int], limit: int = 0, first: bool = False) -> None:
        """Name experts of `layer` to prefetch (read at the next `admit`): those not resident nor in flight, at
        most `limit` of them (0: all), ahead of the ones already planned when `first`."""
        resident, entries = self.cache.resident, self.entries
        new: dict[Key, None] = {}
        for e in experts:
            key = (layer, int(e))
            if key not in resident and key not in entries:
                new[key] = None
                if len(new) == limit:
                    break
        self.planned = {**new, **self.planned} if first else {**self.planned, **new}

    def tap(self, layer: int, phase: int, decode_index: int, hidden: np.ndarray) -> None:
        """A StreamHook tap (layer `layer`'s MoE input, at its first expert matmul): in decode, run the next
        MoE layer's router on it and plan what it names, best first, ahead of the history's candidates."""
        i = self._pos.get(layer)
        if phase != 1 or self.router is None or i is None or i + 1 >= len(self.moe_layers):
            return
        m = self.moe_layers[i + 1]
        names = [int(e) for e in self.router.predict(m, hidden)[-1]]
        self._named[m] = names
        if self.min_recall > 0 and not recall_pays(self._recall_run.get(m), self.min_recall):
            self._gated += 1
            return
        self.plan(m, names, self.spec_max, first=True)

    # -- reads ---------------------------------------------------------------------------------------------
    def admit(self, layer_bound: dict[int, list[Bound]], pending_release: dict[Key, Future]) -> list[Key]:
        """Admit the planned experts the policy keeps and issue their speculative reads; returns the entries
        evicted to make room (the caller releases their pages)."""
        evicted: list[Key] = []
        planned, self.planned = self.planned, {}
        cache, entries = self.cache, self.entries
        for key in planned:
            bounds = layer_bound.get(key[0], ())
            if key in cache.resident or len(bounds) < self.n_tensors[key[0]]:
                continue
            d = pending_release.get(key)
            if d is not None:
                if not d.done():
                    continue  # its pages are still being released: reading now could lose the bytes
                del pending_release[key]
            ok, ev = cache.admit(*key)
            evicted += ev
            if not ok:
                continue
            reads, rids = [], []
            for b in bounds:
                et = b.et
                pos = et.abs_offset + key[1] * et.nb2
                rid = None if self.trace is None else \
                    self.trace.record(key[0], key[1], et.kind, pos, et.nb2, kind="speculative")
                f = self.reader.submit_speculative(et.path, pos, et.nb2, b.res.addr_of(pos), rid)
                reads.append((b.addr, f))
                self._reads.append((f, et.nb2))
                if rid is not None:
                    rids.append(rid)
            entries[key] = _Entry(reads, cache.expert_bytes[key[0]], rids)
            self._fresh.setdefault(key[0], []).append(key)
        return evicted

    def on_evicted(self, key: Key) -> list[Future]:
        """`key` was evicted: when it was an unused prefetch, its bytes are wasted and its queued reads
        cancelled. Returns the reads still running, which the page release must wait for."""
        ent = self.entries.pop(key, None)
        if ent is None:
            return []
        if self.reader.withdraw([f for _, f in ent.reads]):
            self._tok.cancelled += 1
            self._settle(ent, None)
            return []
        self._tok.wasted_bytes += ent.nbytes
        running = []
        for i, (_, f) in enumerate(ent.reads):
            if f.cancel():  # never ran: no row in the io trace
                if self.trace is not None and i < len(ent.rids):
                    self.trace.forget(ent.rids[i])
            elif not f.done():
                running.append(f)
        self._settle(ent, "wasted")
        return running

    def _settle(self, ent: _Entry, what: str | None) -> None:
        """Its --io-trace rows: used, wasted, or (None) removed: withdrawn reads never ran."""
        if self.trace is not None:
            for rid in ent.rids:
                if what is None:
                    self.trace.forget(rid)
                else:
                    self.trace.outcome(rid, what)

    # -- counts --------------------------------------------------------------------------------------------
    def take(self) -> PrefetchCounts:
        """The counts since the last call; completed reads are harvested (a failed one raises here)."""
        c = self._tok
        left = []
        for f, n in self._reads:
            if not f.done():
                left.append((f, n))
            elif not f.cancelled():
                got, ns = f.result()
                c.prefetch_bytes += n
                c.read_bytes += got
                c.io_ns += ns
        self._reads = left
        self._tok = PrefetchCounts()
        self._gen.add(c)
        return c

    def summary(self) -> dict[str, object]:
        """The generation's totals (since the last call) for the summary line: MiB prefetched, used, wasted
        (evicted unused, plus `prefetch_unused_mib`: resident and not used at the end), reads cancelled."""
        late = 0  # reads still in flight after the last token's row: settled here (the compiled lanes report a read's
        for f, n in self._reads:  # --io-trace times when it is collected) and counted in the generation's totals
            with contextlib.suppress(CancelledError):
                if f.exception() is None:
                    late += n
        self._reads = []
        self._gen.prefetch_bytes += late
        g, self._gen = self._gen, PrefetchCounts()
        unused = sum(e.nbytes for e in self.entries.values())
        hit, named = self._agree
        per_layer, self._agree, self._agree_at = self._agree_at, [0, 0], {}
        out: dict[str, object] = {}
        if self.router is not None:  # meaningless under --route-replay (the routing is the trace's, not the model's)
            out["predict_agree"] = round(hit / named, 4) if named else -1
            if self.min_recall > 0:  # layer-tokens whose names went unread, and layers reading at the end
                out["predict_gated"] = self._gated
                out["predict_layers_reading"] = sum(recall_pays(self._recall_run.get(m), self.min_recall)
                                                    for m in self.moe_layers[1:])
                self._gated = 0
            for layer in sorted(per_layer):  # the early router's recall for each layer it named experts of
                h, n = per_layer[layer]
                out[f"predict_agree_l{layer}"] = round(h / n, 4) if n else -1
        out.update({"prefetch_mib": round(g.prefetch_bytes / MIB, 3), "prefetch_used_mib": round(g.used_bytes / MIB, 3),
                    "prefetch_wasted_mib": round((g.wasted_bytes + unused) / MIB, 3),
                    "prefetch_unused_mib": round(unused / MIB, 3), "prefetch_cancelled": g.cancelled,
                    "prefetch_late_bytes": late,
                    "prefetch_used_pct": round(100 * g.used_bytes / g.prefetch_bytes, 3) if g.prefetch_bytes else -1})
        return out


WARM_TOKENS = 8  # decode tokens a layer's recall is measured on before --predict-min-recall may stop its reads


def recall_pays(run: list[int] | None, min_recall: float) -> bool:
    """Whether a layer's named experts are read: yes while fewer than WARM_TOKENS of its decode tokens have been
    measured, then while its recall over the run (used / named) is at least `min_recall`. Pure."""
    if run is None or run[2] < WARM_TOKENS or run[1] == 0:
        return True
    return run[0] / run[1] >= min_recall


def make_prefetcher(ahead: int, predict: bool, spec_max: int, layout: ModelLayout, k: int, cache: ExpertCache,
                    reader: ExpertReader, min_recall: float = 0.0) -> Prefetcher:
    """The run's prefetcher: `--prefetch K` history, and with `--predict-prefetch` the early router (every MoE
    layer's router read from the file once; its `tap` goes into the hook's taps)."""
    router = None
    if predict:
        from harness.engine.routing.early_router import EarlyRouter

        router = EarlyRouter.load(layout, k)
    return Prefetcher(cache, reader, sorted(layout.by_layer), {m: len(ts) for m, ts in layout.by_layer.items()},
                      ahead=ahead, router=router, spec_max=spec_max, min_recall=min_recall)
