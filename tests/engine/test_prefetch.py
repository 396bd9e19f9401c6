"""The prefetcher and the cache's speculative admission on real parts (a generated model's layout, real
reservations, a real SliceReader with its lanes): what is named, what is read, what a hit waits for, and what
is counted used, wasted or cancelled. The byte-identity gates with llama.cpp are in test_prefetch_gates.py."""

from __future__ import annotations

import ctypes

import pytest

from harness.engine.cache.expert_cache import ExpertCache
from harness.engine.cache.prefetch import Prefetcher
from harness.engine.io.reader import SliceReader
from harness.engine.io.tracing import Tracing
from harness.engine.io.vm import Reservation
from harness.engine.model.gguf_layout import load_layout
from harness.engine.stream.hook import Bound
from harness.formats.traces import ReadRow
from harness.synth import ModelSpec, make_model
from tests.helpers.lanes import Hold

T = 10.0


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    path = make_model(tmp_path_factory.mktemp("pf") / "m.gguf", ModelSpec(expert_type="q8_0", seed=43))[0]
    return load_layout(path)


@pytest.fixture
def parts(layout, impl):
    reader = SliceReader(layout.shards, 1, odirect=False)
    bound = {m: [Bound(1000 * m + i, et, Reservation(et.nbytes, et.abs_offset), isolate=i < len(ets) - 1)
                 for i, et in enumerate(ets)] for m, ets in layout.by_layer.items()}
    eb = layout.expert_bytes_per_layer()
    yield layout, reader, bound, eb
    reader.close()


def _prefetcher(layout, reader, cache, ahead=1) -> Prefetcher:
    return Prefetcher(cache, reader, sorted(layout.by_layer), {m: len(t) for m, t in layout.by_layer.items()},
                      ahead=ahead)


class _Gate:
    def __init__(self, hold: Hold):
        self.hold = hold

    def set(self) -> None:
        self.hold.release(0)


def _block(reader) -> _Gate:
    """Occupy the reader's one lane with a demand job until the returned gate is set."""
    h = Hold(reader)
    h.submit(0)
    h.wait_holding(1)
    return _Gate(h)


def _landed(b: Bound, e: int) -> bool:
    et = b.et
    pos = et.abs_offset + e * et.nb2
    with open(et.path, "rb") as f:
        f.seek(pos)
        want = f.read(et.nb2)
    return ctypes.string_at(b.res.addr_of(pos), et.nb2) == want


def test_history_names_the_next_layers_last_experts_not_resident_wrapping_round(parts):
    layout, reader, bound, eb = parts
    cache = ExpertCache(100 * eb[0], eb, "lru")
    pf = _prefetcher(layout, reader, cache, ahead=2)
    for m in range(4):
        pf.on_routed(m, [], [m, m + 1], decode=False)  # prefill: remembered, nothing planned
    assert not pf.planned
    cache.lookup_batch(2, [2])  # (2, 2) is resident: not named
    pf.on_routed(1, [], [1, 2], decode=True)
    assert list(pf.planned) == [(2, 3), (3, 3), (3, 4)]
    pf.planned.clear()
    pf.on_routed(3, [], [3, 4], decode=True)  # past the last layer: the next token's first ones
    assert list(pf.planned) == [(0, 0), (0, 1), (1, 1), (1, 2)]


def test_a_hit_on_a_prefetched_expert_waits_for_its_reads_and_counts_as_used(parts):
    layout, reader, bound, eb = parts
    cache = ExpertCache(100 * eb[0], eb, "lru")
    pf = _prefetcher(layout, reader, cache)
    tr = Tracing(io=True, compute=False)
    reader.recorder = pf.trace = tr.io
    assert tr.io is not None
    gate = _block(reader)
    pf.plan(1, [5])
    assert pf.admit(bound, {}) == []
    assert (1, 5) in cache.resident and cache.stats.lookups == 0  # admitted without a lookup
    r = cache.lookup_batch(1, [5], evict=False)
    assert r.hits == [5] and r.misses == []  # no second read
    wait = pf.on_routed(1, r.hits, [5], decode=True)
    assert sorted(a for a, _ in wait) == [b.addr for b in bound[1]]
    assert all(not f.done() for _, f in wait)
    rid = tr.io.record(2, 0, "demand-read", bound[2][0].et.abs_offset, 64)
    demand = reader.submit(bound[2][0].et.path, bound[2][0].et.abs_offset, 64, bound[2][0].res.data, rid)
    gate.set()
    for _, f in wait:
        f.result(T)
    demand.result(T)
    # promoted to demand priority, queued before the later demand read: on the one lane, done before it
    rows = {r.read: r for r in (ReadRow(*x) for x in tr.io.take(final=True))}
    assert rows[rid].finished_ns > 0 and rows[rid].finished_ns > max(r.finished_ns for k, r in rows.items() if k != rid)
    assert all(_landed(b, 5) for b in bound[1])
    c = pf.take()
    assert (c.prefetch_bytes, c.used_bytes, c.wasted_bytes, c.cancelled) == (eb[1], eb[1], 0, 0)
    assert c.read_bytes == eb[1] and not pf.entries


def test_a_layer_routed_without_it_withdraws_reads_not_started(parts):
    layout, reader, bound, eb = parts
    cache = ExpertCache(100 * eb[0], eb, "lru")
    pf = _prefetcher(layout, reader, cache)
    gate = _block(reader)
    pf.plan(2, [6])
    pf.admit(bound, {})
    pf.on_routed(2, [], [1], decode=False)
    assert (2, 6) not in cache.resident and cache.resident_bytes == 0 and cache.stats.evictions == 0
    gate.set()
    c = pf.take()
    assert (c.prefetch_bytes, c.used_bytes, c.wasted_bytes, c.cancelled) == (0, 0, 0, 1)


def test_evicted_before_use_is_wasted_and_evicted_while_queued_is_cancelled(parts):
    layout, reader, bound, eb = parts
    cache = ExpertCache(3 * eb[0], eb, "lru")
    pf = _prefetcher(layout, reader, cache)
    pf.plan(3, [7])
    pf.admit(bound, {})
    for f in [f for _, f in pf.entries[(3, 7)].reads]:
        f.result(T)  # read in full, never used
    cache.lookup_batch(0, [0, 1, 2])  # evicts the least recent: the prefetched entry
    assert (3, 7) not in cache.resident
    assert pf.on_evicted((3, 7)) == []  # nothing still running
    c = pf.take()
    assert (c.prefetch_bytes, c.used_bytes, c.wasted_bytes) == (eb[3], 0, eb[3])
    assert pf.on_evicted((0, 0)) == []  # not a prefetched entry: nothing counted
    gate = _block(reader)
    cache.lookup_batch(1, [0])  # the last batch (protected) is now (1, 0) alone
    pf.plan(3, [6])
    assert pf.admit(bound, {}) == [(0, 1)]  # room made with LRU's victim
    reads = [f for _, f in pf.entries[(3, 6)].reads]
    assert pf.on_evicted((3, 6)) == []  # evicted while queued: cancelled, no bytes
    assert all(f.cancelled() for f in reads)
    gate.set()
    c = pf.take()
    assert (c.prefetch_bytes, c.wasted_bytes, c.cancelled) == (0, 0, 1)


def test_admit_skips_an_expert_whose_pages_are_still_being_dropped(parts):
    layout, reader, bound, eb = parts
    cache = ExpertCache(100 * eb[0], eb, "lru")
    pf = _prefetcher(layout, reader, cache)
    from concurrent.futures import Future

    busy, done = Future(), Future()
    done.set_result(None)
    pending = {(1, 1): busy, (1, 2): done}
    pf.plan(1, [1, 2])
    pf.admit(bound, pending)
    assert (1, 1) not in cache.resident and (1, 2) in cache.resident and (1, 2) not in pending


def test_the_early_router_tap_plans_the_next_layers_names_best_first_and_bounded(parts):
    import numpy as np

    from harness.engine.routing.early_router import EarlyRouter

    layout, reader, bound, eb = parts
    cache = ExpertCache(100 * eb[0], eb, "lru")
    router = EarlyRouter.load(layout, 2)
    pf = _prefetcher(layout, reader, cache, ahead=1)
    pf.router, pf.spec_max = router, 1
    hidden = np.random.default_rng(0).standard_normal((1, router.routers[0].weight.shape[1])).astype(np.float32)
    names = [int(e) for e in router.predict(1, hidden)[0]]
    pf.tap(0, 0, -1, hidden)  # prefill: nothing
    assert not pf.planned
    pf.planned = {(3, 0): None}  # a history candidate already planned
    pf.tap(0, 1, 0, hidden)
    assert list(pf.planned) == [(1, names[0]), (3, 0)]  # the best name only (spec_max 1), ahead of the history's
    cache.lookup_batch(1, [names[0]])
    pf.planned = {}
    pf.tap(0, 1, 0, hidden)
    assert list(pf.planned) == [(1, names[1])]  # the resident one is skipped and not counted against the bound
    pf.planned = {}
    pf.tap(3, 1, 0, hidden)  # the last MoE layer: no next layer in this token
    assert not pf.planned
    pf.on_routed(1, [], [names[1], next(e for e in range(8) if e not in names)], decode=True)
    assert pf.summary()["predict_agree"] == 0.5


def test_cache_admit_makes_room_with_the_policys_victims_and_counts_nothing():
    eb = [100, 100]
    c = ExpertCache(200, eb, "lru")
    c.lookup_batch(0, [1])
    c.lookup_batch(0, [2])
    c.lookup_batch(1, [3])  # evicts (0, 1); protects (1, 3)
    before = (c.stats.lookups, c.stats.hits, c.stats.misses, c.stats.bytes_read)
    ok, ev = c.admit(1, 4)
    assert ok and ev == [(0, 2)] and c.resident == {(1, 3), (1, 4)}
    assert (c.stats.lookups, c.stats.hits, c.stats.misses, c.stats.bytes_read) == before
    assert c.admit(1, 4) == (False, [])  # already resident


def test_cache_admit_is_refused_when_the_policy_values_the_new_entry_least():
    c = ExpertCache(200, [100], "lfu")
    c.lookup_batch(0, [1, 2])
    c.lookup_batch(0, [1, 2])  # both used twice; the batch protects them
    ok, ev = c.admit(0, 3)
    assert not ok and ev == [] and c.resident == {(0, 1), (0, 2)} and c.stats.evictions == 0
    c.lookup_batch(0, [1])  # (0, 2) unprotected now, counted twice against the newcomer's once
    assert c.admit(0, 3) == (True, [(0, 2)])  # LFU's counts outlive residency: the refused insert was counted


@pytest.mark.parametrize("argv,needle", [
    (["--cache-mb", "0", "--prefetch", "1"], "--prefetch reads experts ahead into the expert cache, so it needs one"),
    (["--cache-mb", "100", "--cache-preload", "--prefetch", "1"], "every expert is resident"),
])
def test_prefetch_flag_rules(argv, needle):
    from harness.engine.config import parse_cli
    from harness.errors import UserError

    with pytest.raises(UserError, match=needle):
        parse_cli(["-m", "x.gguf", "--moe-stream", *argv])
    assert parse_cli(["-m", "x.gguf", "--moe-stream", "--prefetch", "2"]).prefetch == 2


def test_min_recall_reads_until_measured_then_by_recall():
    from harness.engine.cache.prefetch import WARM_TOKENS, recall_pays

    assert recall_pays(None, 0.9)  # never measured: read
    assert recall_pays([0, 4 * (WARM_TOKENS - 1), WARM_TOKENS - 1], 0.9)  # still warming up: read
    assert not recall_pays([1, 4 * WARM_TOKENS, WARM_TOKENS], 0.5)  # measured and poor: stop
    assert recall_pays([3 * WARM_TOKENS, 4 * WARM_TOKENS, WARM_TOKENS], 0.5)  # 75% >= 50%: read
