"""The hook's state, one object per stage: what each stage keeps between callbacks. `StreamHook` holds one of each
(`binds`, `releases`, `accounts`, `early`, `routing`, `dense_scan`, `tapping`, `hidden`) beside what every stage
shares (the layout, cache, reader, counters, phase and decode index) and what the rest of the engine reads (see
hook.py). Slotted; a hot path binds its group to a local once. The grouping costs nothing measurable (by hand, bench
shape, --cache-mb 1024 -t 1 -n 48 on a loaded 2-core VM, main 630e290 vs grouped: the mgmt sections' CPU per token
from harness.engine.diag.mgmt_profile 4.38/4.73/4.83 ms before, 3.98/4.94/4.36 after; the CSV's mgmt_cpu_ms 3.84/3.81
before, 3.51/4.76 after).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from harness.engine.io.release import PageReleaser, ReleaseBatch
from harness.engine.io.vm import SharedSlot
from harness.engine.stream.common import Bound, RouteEvent

if TYPE_CHECKING:
    from harness.engine.cache.evictor import Evictor
    from harness.engine.io.dense import AnonDense
    from harness.engine.io.recycle import PagePool
    from harness.engine.routing.route_replay import RouteReplay

Key = tuple[int, int]  # (layer, expert)


@dataclass(slots=True, eq=False)
class BindState:
    """bind.py: routed-expert tensors bound to their memory, and the reads each expert matmul waits for."""

    shared: bool  # no cache: every layer's tensors of a kind share one buffer (vm.SharedSlot), reused every token
    last_kind: str  # the expert tensor kind computed last in a layer (down): its matmul is not isolated
    bound: dict[int, Bound | None] = field(default_factory=dict)  # tensor address -> binding (None: not an expert)
    layer_bound: dict[int, list[Bound]] = field(default_factory=dict)
    last_addr: dict[int, int] = field(default_factory=dict)  # layer -> address of its last expert matmul's tensor
    pending: dict[int, list[int]] = field(default_factory=dict)  # layer -> misses not yet read for unbound tensors
    inflight: dict[int, list[Future]] = field(default_factory=dict)  # tensor address -> its demand reads
    spec_wait: dict[int, list[Future]] = field(default_factory=dict)  # tensor address -> prefetch reads it needs
    slots: dict[str, SharedSlot] = field(default_factory=dict)  # kind -> its shared buffer (shared)
    pool: PagePool | None = None  # --recycle-pages: the reservations' pages come from and go back to it


@dataclass(slots=True, eq=False)
class ReleaseState:
    """account.py: evicted slices' pages released off the compute thread, in batches (io/release.py)."""

    releaser: PageReleaser
    pending: dict[Key, ReleaseBatch] = field(default_factory=dict)  # an evicted key -> the batch releasing its pages
    recent: list[ReleaseBatch] = field(default_factory=list)  # this token's batches (a failure is raised at its end)
    bounds: dict[int, tuple[tuple[Bound, ...], int]] = field(default_factory=dict)  # a layer bound for good: its
    # bounds and the bytes of one expert's slices in them


@dataclass(slots=True, eq=False)
class AccountState:
    """account.py: a layer batch's cache lookups, reads and evictions."""

    preload: bool  # read every expert of a layer at its first pass (--cache-preload)
    evictor: Evictor | None  # decode evictions on a helper thread (None: on the compute thread)
    record_routes: bool  # keep each batch's RouteEvent (a route trace)
    evict_due: bool = False  # the last batch's evictions are still to be decided
    preloaded: set[int] = field(default_factory=set)
    bound_all: set[int] = field(default_factory=set)  # layers whose expert tensors are all bound (for good)
    routes: list[RouteEvent] = field(default_factory=list)  # recorded since the last take_routes


@dataclass(slots=True, eq=False)
class EarlyState:
    """account.py and route.py: route-ahead with a cache, a committed layer accounted and read at commit time."""

    held: dict[int, set[Key]] | None  # layer -> its batch, accounted, not computed (None: no early reads)
    layers: set[int] = field(default_factory=set)  # accounted (and read) at commit time, before their routing node
    deferred: dict[int, list[Key]] = field(default_factory=dict)  # layer -> entries evicted while it was held


@dataclass(slots=True, eq=False)
class RouteState:
    """route.py: the routing nodes."""

    topk_prefix: bytes  # "ffn_moe_topk-" (the arch row's routing node name and a dash)
    replay: RouteReplay | None  # overwrite the selected ids with a recorded trace's
    first_moe_layer: int
    topk_layer: dict[bytes, int] = field(default_factory=dict)  # routing node name -> its layer (parsed once)
    routed: set[int] = field(default_factory=set)  # layers whose routing node has been seen (before their matmuls)


@dataclass(slots=True, eq=False)
class DenseScan:
    """dense_stage.py: --dense-weights anon, dense weights rebound to their anonymous copies on first sight."""

    anon: AnonDense | None
    active: bool  # the first graphs are still being scanned
    seen: set[int] = field(default_factory=set)  # sources already looked at


@dataclass(slots=True, eq=False)
class TapState:
    """taps.py: handing a layer's MoE input to the taps (StreamHook.taps)."""

    due: int | None = None  # the layer whose routing node was seen and whose input is not tapped yet
    skipped: set[int] = field(default_factory=set)  # layers whose matmul input is not the plain MoE input (llama4)


@dataclass(slots=True, eq=False)
class HiddenClock:
    """bind.py, account.py, route.py: the mgmt time spent beside in-flight demand reads, counted hidden
    (TokenCounters.mgmt_hidden_ns) if the wait that follows is a real one."""

    ns: int = 0
    submitted: int = 0  # when _on_topk's batch reads were submitted (0: none in this section)
