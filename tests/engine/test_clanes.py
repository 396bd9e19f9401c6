"""The compiled read lanes (harness.engine.io.clanes) against the Python ones, with real files and real reads: the
bytes that land are the file's and the same on both, buffered and O_DIRECT (and O_DIRECT's EINVAL fallback);
a batch is one handle summing its reads; a failed read is the same one-line error on both; the io-trace times
and lanes come back; clanes.use_python (the CLI's BMOE_PURE_PYTHON_LANES=1) selects the Python lanes."""

from __future__ import annotations

import ctypes
import os
import random

import pytest

from harness.engine.io import clanes
from harness.engine.io.read_group import Gather, chunks, wait_done
from harness.engine.io.reader import SliceReader
from harness.engine.io.vm import PAGE, Reservation, SharedSlot
from tests.helpers.lanes import Hold

SIZE = 3 * 1024 * 1024 + 1234  # not a whole number of pages: the last O_DIRECT read is short of its superset


@pytest.fixture(scope="module")
def blob(tmp_path_factory):
    p = tmp_path_factory.mktemp("clanes") / "blob.bin"
    p.write_bytes(random.Random(7).randbytes(SIZE))
    return p


def _slices(seed: int, n: int = 60) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    out = [(SIZE - 777, 777), (0, 1), (PAGE - 1, 2)]  # the file's tail, its first byte, a page boundary
    while len(out) < n:
        pos = rng.randrange(0, SIZE - 1)
        out.append((pos, rng.randrange(1, min(200_000, SIZE - pos) + 1)))
    return out


def _read_all(path, odirect: bool, batched: bool | str, lanes: int = 3) -> tuple[bytes, int, SliceReader]:
    """Every slice of _slices into one reservation laid out as the file (addresses congruent to offsets)."""
    res = Reservation(SIZE, 0)
    r = SliceReader([path], lanes, odirect=odirect)
    try:
        sl = _slices(1)
        if batched == "layer":  # groups of 5 slices, several groups per call (a layer's tensors)
            groups = [(path, [(p, n, res.addr_of(p), None) for p, n in run]) for run in chunks(sl, 5)]
            futs = [f for part in chunks(groups, 3) for f in r.submit_layer(part)]
        elif batched:
            futs = [r.submit_many(path, [(p, n, res.addr_of(p), None) for p, n in run]) for run in chunks(sl, 5)]
        else:
            futs = [r.submit(path, p, n, res.addr_of(p)) for p, n in sl]
        got = sum(f.result()[0] for f in futs)
        covered = bytearray(SIZE)
        for p, n in sl:
            covered[p:p + n] = ctypes.string_at(res.addr_of(p), n)
        return bytes(covered), got, r
    finally:
        r.close()


@pytest.mark.parametrize("odirect", [False, True], ids=["buffered", "odirect"])
@pytest.mark.parametrize("batched", [False, True, "layer"], ids=["submit", "submit_many", "submit_layer"])
def test_the_bytes_that_land_are_the_files_on_both_implementations(blob, impl, odirect, batched):
    data, got, r = _read_all(blob, odirect, batched)
    want = bytearray(SIZE)
    full = blob.read_bytes()
    for p, n in _slices(1):
        want[p:p + n] = full[p:p + n]
    assert data == bytes(want)
    assert r.lanes_impl == impl and r.odirect_refused is None
    if odirect:
        assert got >= sum(n for _, n in _slices(1))  # O_DIRECT reads whole pages around each slice
    else:
        assert got == sum(n for _, n in _slices(1))


def test_one_call_of_several_groups_wakes_every_lane_in_turn(blob, monkeypatch):
    """submit_groups wakes one lane and each lane that takes a job wakes the next: four one-job groups in one
    call occupy all four lanes at once (with one wake-up and no chaining only one lane would ever run)."""
    monkeypatch.setattr(clanes, "_python", False)
    if clanes.load() is None:
        pytest.fail("the compiled read lanes (_clanes*.so) are not built")
    r = SliceReader([blob], 4, odirect=False)
    try:
        c = r._c
        gs = c.submit_groups([-1] * 4, [1] * 4, [x for i in range(4) for x in (i, 0, 0)], [None] * 4,
                             [lambda *a: RuntimeError("hold failed")] * 4)  # file -1: a job that holds its lane
        Hold(r).wait_holding(4)
        for i in range(4):
            c.release_hold(i)
        assert [g.result()[0] for g in gs] == [0, 0, 0, 0]
    finally:
        r.close()


def test_both_implementations_give_identical_bytes_and_counts(blob, monkeypatch):
    out = {}
    for impl in ("1", "0"):
        monkeypatch.setattr(clanes, "_python", impl == "1")
        for odirect in (False, True):
            data, got, r = _read_all(blob, odirect, batched=True)
            out[(impl, odirect)] = (data, got)
            assert r.lanes_impl == ("python" if impl == "1" else "c")
    assert out[("1", False)] == out[("0", False)] and out[("1", True)] == out[("0", True)]
    assert out[("1", False)][0] == out[("1", True)][0]


def test_odirect_einval_falls_back_to_buffered_reads_with_one_note(blob, impl):
    """A destination not congruent to its file offset makes the O_DIRECT read fail with EINVAL: that file then
    reads buffered, the bytes are right, and the reader says so (as on a filesystem that accepts the open only)."""
    r = SliceReader([blob], 2, odirect=True)
    try:
        assert r.odirect
        buf = ctypes.create_string_buffer(PAGE * 3)
        addr = (ctypes.addressof(buf) + PAGE - 1) // PAGE * PAGE + 8  # 8 bytes off a page: not congruent to 0
        assert r.submit(blob, 0, 5000, addr).result()[0] == 5000
        assert ctypes.string_at(addr, 5000) == blob.read_bytes()[:5000]
        assert not r.odirect and "reading buffered" in (r.odirect_refused or "")
        assert r.submit(blob, 100, 10, addr).result()[0] == 10  # buffered from now on
    finally:
        r.close()


def test_a_failed_read_is_the_same_one_line_error_on_both(blob, monkeypatch):
    msgs = {}
    for impl in ("1", "0"):
        monkeypatch.setattr(clanes, "_python", impl == "1")
        r = SliceReader([blob], 1, odirect=False)
        buf = ctypes.create_string_buffer(64)
        try:
            short = r.submit_many(blob, [(SIZE - 10, 64, ctypes.addressof(buf), None)])
            with pytest.raises(OSError) as e:
                short.result()
            msgs[("short", impl)] = str(e.value)
            os.close(r.fd_buf[blob])  # the descriptor under the lanes: EBADF on the next read
            bad = r.submit(blob, 0, 64, ctypes.addressof(buf))
            with pytest.raises(OSError) as e:
                bad.result()
            msgs[("errno", impl)] = (e.value.errno, str(e.value))
            r.fd_buf[blob] = os.open(blob, os.O_RDONLY)  # close() closes it
        finally:
            r.close()
    assert msgs[("short", "1")] == msgs[("short", "0")]
    assert "truncated" in msgs[("short", "1")] and str(blob) in msgs[("short", "1")]
    assert msgs[("errno", "1")] == msgs[("errno", "0")]
    assert msgs[("errno", "1")][0] == 9 and f"reading 64 bytes at offset 0 of {blob}" in msgs[("errno", "1")][1]


def test_a_batch_is_one_handle_summing_its_reads_and_traced_reads_come_back(blob, impl):
    class Rec:
        def __init__(self):
            self.rows = {}

        def read_done(self, rid, t0, t1, nbytes, lane=None):
            self.rows[rid] = (t0, t1, nbytes, lane)

    r = SliceReader([blob], 2, odirect=False)
    r.recorder = rec = Rec()
    res = Reservation(SIZE, 0)
    try:
        f = r.submit_many(blob, [(i * 1000, 1000, res.addr_of(i * 1000), 10 + i) for i in range(8)])
        got, ns = f.result()
        assert got == 8000 and ns > 0 and f.done()
        assert sorted(rec.rows) == list(range(10, 18))
        for t0, t1, n, lane in rec.rows.values():
            assert t1 >= t0 > 0 and n == 1000
            assert lane is None or lane in (0, 1)
        untraced = r.submit_many(blob, [(0, 10, res.addr_of(0), None)])
        assert untraced.result() == (10, untraced.result()[1]) and len(rec.rows) == 8
    finally:
        r.close()


def test_the_environment_switch_selects_the_python_lanes(blob, monkeypatch):
    monkeypatch.setattr(clanes, "_python", True)
    assert clanes.load() is None
    monkeypatch.setattr(clanes, "_python", False)
    assert clanes.load() is not None  # built in this checkout: the compiled lanes are the default


def test_gather_and_wait_done():
    from concurrent.futures import Future

    a, b, c = Future(), Future(), Future()
    a.set_result((3, 1))
    b.set_result((4, 2))
    c.cancel()
    g = Gather([a, b])
    assert g.result() == (7, 3) and g.done() and g.exception() is None
    wait_done([a, b, c])  # a cancelled one does not raise
    assert [len(x) for x in chunks(list(range(10)), 4)] == [3, 3, 2, 2] and chunks([1], 4) == [[1]]


# -- registered tensors: a layer's misses in one call, C computing each read (SliceReader.submit_registered) -----
NB2 = 5000  # a slice size that is not a whole number of pages: O_DIRECT reads neighbouring bytes around each
TENSORS = [(1234, 40), (1234 + 40 * NB2, 40), (700_001, 50)]  # (file offset, experts) of a layer's 3 tensors


def _layer_reads(path, odirect: bool, registered: bool, misses: list[int]) -> tuple[list[bytes], list[int]]:
    """A layer's misses read into fresh reservations (one a SharedSlot view, as without a cache), either as
    explicit (pos, len, addr) reads (submit_layer) or through registered tensors; every reservation's bytes and
    each tensor's result()[0]."""
    slot = SharedSlot(max(n * NB2 for _, n in TENSORS))
    res = [Reservation(n * NB2, off) for off, n in TENSORS[:2]] + [slot.view(TENSORS[2][1] * NB2, TENSORS[2][0])]
    r = SliceReader([path], 3, odirect=odirect)
    try:
        if registered:
            ids = [r.register(path, off, NB2, v.addr_of(off)) for (off, _), v in zip(TENSORS, res, strict=True)]
            futs = r.submit_registered(ids, misses)
        else:
            futs = r.submit_layer([(path, [(off + e * NB2, NB2, v.addr_of(off + e * NB2), None) for e in misses])
                                   for (off, _), v in zip(TENSORS, res, strict=True)])
        got = [f.result()[0] for f in futs]
        return [ctypes.string_at(v.base, v.total) for v in res], got
    finally:
        r.close()


@pytest.mark.parametrize("odirect", [False, True], ids=["buffered", "odirect"])
def test_registered_tensors_read_the_same_bytes_to_the_same_addresses(blob, impl, odirect):
    """submit_registered (on the compiled lanes one C call computing each read) lands every byte, the slices'
    and the O_DIRECT neighbours', where submit_layer with the (pos, len, addr) reads does, and counts the same."""
    misses = [39, 0, 7, 8, 21]  # any order (the cache's), the first and last experts
    old = _layer_reads(blob, odirect, False, misses)
    new = _layer_reads(blob, odirect, True, misses)
    assert new == old
    full = blob.read_bytes()
    for (off, _), data, v in zip(TENSORS, new[0], [Reservation(1, o) for o, _ in TENSORS], strict=True):
        for e in misses:
            a = v.addr_of(off + e * NB2) - v.base  # the same layout in a fresh reservation of this offset
            assert data[a:a + NB2] == full[off + e * NB2:off + (e + 1) * NB2]
    assert min(new[1]) >= len(misses) * NB2  # O_DIRECT: the pages around each slice too
    if not odirect:
        assert new[1] == [len(misses) * NB2] * 3


def test_registered_reads_queue_in_submit_groups_order(blob, monkeypatch):
    """On the compiled lanes bmoe_lanes_submit_layer queues the same groups and reads in the same order as
    bmoe_lanes_submit_groups: one lane held while both are queued, then each read's start time and size."""
    monkeypatch.setattr(clanes, "_python", False)
    if clanes.load() is None:
        pytest.fail("the compiled read lanes (_clanes*.so) are not built")
    res = [Reservation(n * NB2, off) for off, n in TENSORS]
    misses = [5, 2, 9]
    r = SliceReader([blob], 1, odirect=False)
    c = r._c
    try:
        ids = [r.register(blob, off, NB2, v.addr_of(off)) for (off, _), v in zip(TENSORS, res, strict=True)]
        hold = c.submit_hold(0)
        Hold(r).wait_holding(1)
        a = (ctypes.c_void_p * 3)()
        assert c.q.bmoe_lanes_submit_layer(c.handle, 3, (ctypes.c_int * 3)(*ids), 3, (ctypes.c_int * 3)(*misses), a, 1)
        flat = [x for (off, _), v in zip(TENSORS, res, strict=True) for e in misses for x in
                (off + e * NB2, NB2, v.addr_of(off + e * NB2))]
        b = (ctypes.c_void_p * 3)()
        assert c.q.bmoe_lanes_submit_groups(c.handle, 3, (ctypes.c_int * 3)(0, 0, 0), (ctypes.c_int * 3)(3, 3, 3),
                                            (ctypes.c_int64 * len(flat))(*flat), 0, b)
        c.release_hold(0)
        hold.result()
        runs = []
        for gs in (a, b):
            for g in gs:
                out, d = (ctypes.c_int64 * 6)(), (ctypes.c_int64 * 8)()
                c.lib.bmoe_lanes_collect(c.handle, g, out)
                assert list(out)[2:] == [-1, -1, 0, 3]  # no failure, no fallback, none cancelled, 3 done
                for i in range(3):
                    c.q.bmoe_lanes_detail(g, i, d)
                    runs.append((d[1], d[0]))  # started, bytes
                c.q.bmoe_lanes_release(c.handle, g)
        assert [t for t, _ in runs] == sorted(t for t, _ in runs)  # one lane: FIFO, a's reads then b's
        assert [n for _, n in runs] == [NB2] * 18
    finally:
        r.close()


def test_a_library_without_the_layer_call_and_an_unknown_id(blob, monkeypatch):
    """A built library older than the layer call (a stale build): submit_registered reads the same bytes
    through submit_groups. An id never registered is an error, not a read."""
    monkeypatch.setattr(clanes, "_python", False)
    if clanes.load() is None:
        pytest.fail("the compiled read lanes (_clanes*.so) are not built")
    want = _layer_reads(blob, False, False, [3, 1])
    monkeypatch.setattr(clanes, "LAYER_VERSION", 99)
    r = SliceReader([blob], 2, odirect=False)
    assert r._c is not None and not r._c.layer
    r.close()
    assert _layer_reads(blob, False, True, [3, 1]) == want
    monkeypatch.undo()
    r = SliceReader([blob], 2, odirect=False)
    try:
        assert r._c is not None and r._c.layer
        with pytest.raises(RuntimeError, match="not all registered"):
            r.submit_registered([0], [1])
    finally:
        r.close()
