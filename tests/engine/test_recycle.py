"""The page pools of --recycle-pages, each kind in both twins (compiled: clanes_pool.c, clanes_move.c; Python:
harness.engine.io.recycle, recycle_move). memfd: a slice's whole pages become a memfd chunk before its read, an evicted
slice's chunk goes back to the pool and to the next miss without being zeroed, the cap and the VMA limit hold, the
mappings merge back when the chunks are detached. move: an evicted slice's pages stay until a miss moves them in
(UFFDIO_MOVE) or the slice takes them back, the cap holds, no mapping is added. Neighbours' boundary pages are never
touched; and the same through the read lanes of a SliceReader, compiled and Python."""

from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path

import pytest

from harness.engine.io import clanes, recycle, sysstats
from harness.engine.io.reader import SliceReader
from harness.engine.io.recycle_move import PyMovePool
from harness.engine.io.vm import PAGE, Reservation

NB2 = 5 * PAGE + 96  # a slice of 5-6 whole pages that starts and ends inside shared pages, as in a GGUF
OFF = 4096 + 32  # the tensor's file offset: 32-byte aligned, not page aligned
N_EXPERT = 8
CHUNK = recycle.GRANULE * PAGE  # one granule holds a slice of NB2 bytes


def _lib():
    lib = clanes.load()
    assert lib is not None and lib.bmoe_lanes_version() >= clanes.POOL_VERSION, "the compiled lanes were not built"
    return lib


def _pool(impl: str, cap: int, **kw) -> recycle.PagePool:
    if impl == "python":
        return recycle.PyPagePool(cap, **kw)
    return recycle.CPagePool(_lib(), cap, **kw)


def _move_pool(impl: str, cap: int, attached_max: int = 64) -> recycle.PagePool:
    if impl == "python":
        return PyMovePool(cap, attached_max)
    return recycle.CPagePool(_lib(), cap, attached_max=attached_max, kind="move")


@pytest.fixture
def model(tmp_path) -> tuple[Path, bytes]:
    data = os.urandom(OFF + N_EXPERT * NB2 + PAGE)
    p = tmp_path / "t.bin"
    p.write_bytes(data)
    return p, data


def _slice(e: int) -> tuple[int, int]:
    return OFF + e * NB2, OFF + (e + 1) * NB2


def _read(res: Reservation, path: Path, e: int, attach=None) -> None:
    a, b = _slice(e)
    addr = res.addr_of(a)
    if attach is not None:
        attach(addr, NB2)
    with open(path, "rb") as f:
        os.preadv(f.fileno(), [memoryview((ctypes.c_char * NB2).from_address(addr)).cast("B")], a)


def _bytes(res: Reservation, e: int) -> bytes:
    return ctypes.string_at(res.addr_of(_slice(e)[0]), NB2)


def _vmas(res: Reservation) -> int:
    """The mappings over the reservation (others come and go with the interpreter's own allocations)."""
    n = 0
    with open("/proc/self/maps") as f:
        for line in f:
            a, b = (int(x, 16) for x in line.split()[0].split("-"))
            n += a < res.base + res.total and b > res.base
    return n


def _whole_pages(res: Reservation, e: int) -> bytes:
    a, n = res.pages(*_slice(e))
    return ctypes.string_at(a, n)


@pytest.mark.parametrize("impl", ["c", "python"])
def test_an_evicted_slice_pages_go_to_the_next_miss_unzeroed_and_every_byte_is_the_file(model, impl):
    path, data = model
    pool = _pool(impl, 8 * CHUNK)
    res = Reservation(N_EXPERT * NB2, OFF, pool)
    vmas0 = _vmas(res)
    for e in range(4):
        _read(res, path, e, pool.attach)
    assert pool.stats()["pool_fresh"] == 4 and pool.stats()["pool_attached"] == 4
    assert _vmas(res) > vmas0  # each attached slice is a mapping of its own
    for e in range(4):
        assert _bytes(res, e) == data[slice(*_slice(e))]
    old = _whole_pages(res, 1)
    res.release(*_slice(1))  # evicted: its chunk back to the pool, anonymous (zero) pages in its place
    assert _whole_pages(res, 1) == bytes(len(old))
    assert _bytes(res, 0) == data[slice(*_slice(0))] and _bytes(res, 2) == data[slice(*_slice(2))], \
        "a neighbour's bytes changed when a slice was released"
    # the next miss gets the same physical pages, not zeroed ones: before its read they hold the evicted slice's bytes
    a, b = _slice(5)
    assert pool.attach(res.addr_of(a), NB2) == 1
    got = _whole_pages(res, 5)
    assert got == old[:len(got)], "the recycled chunk was zeroed (or is not the evicted slice's)"
    _read(res, path, 5)
    assert _bytes(res, 5) == data[a:b]
    st = pool.stats()
    assert (st["pool_recycled"], st["pool_fresh"], st["pool_detached"], st["pool_errors"]) == (1, 4, 1, 0)
    assert st["pool_bytes"] == 4 * CHUNK
    for e in (0, 2, 3, 5):
        res.release(*_slice(e))
    assert pool.stats()["pool_attached"] == 0
    assert _vmas(res) == vmas0, "the reservation's mappings did not merge back after every chunk left"
    pool.close()


@pytest.mark.parametrize("impl", ["c", "python"])
def test_the_cap_and_the_attached_limit_hold_and_what_finds_no_chunk_reads_as_before(model, impl):
    path, data = model
    for pool in (_pool(impl, 2 * CHUNK), _pool(impl, 100 * CHUNK, attached_max=2)):
        res = Reservation(N_EXPERT * NB2, OFF, pool)
        for e in range(3):
            _read(res, path, e, pool.attach)
            assert _bytes(res, e) == data[slice(*_slice(e))]
        st = pool.stats()
        assert (st["pool_fresh"], st["pool_fallback"], st["pool_attached"], st["pool_bytes"]) == (2, 1, 2, 2 * CHUNK)
        res.release(*_slice(2))  # the slice without a chunk: MADV_DONTNEED, as without the pool
        assert pool.stats()["pool_dontneed"] == 1 and _whole_pages(res, 2) == bytes(len(_whole_pages(res, 2)))
        pool.close()


@pytest.mark.parametrize("impl", ["c", "python"])
def test_reads_outside_the_registered_tensors_are_left_alone(model, impl):
    pool = _pool(impl, 8 * CHUNK)
    res = Reservation(N_EXPERT * NB2, OFF, pool)
    other = Reservation(N_EXPERT * NB2, OFF)  # a dense weight's memory, say: not a region of the pool
    assert pool.attach(other.addr_of(OFF), NB2) == 0
    assert pool.attach(res.addr_of(OFF), 100) == 0  # no whole page
    assert pool.attach(res.addr_of(OFF), NB2) == 2
    assert pool.attach(res.addr_of(OFF), NB2) == 0  # attached already: the same pages
    assert pool.stats()["pool_attached"] == 1
    pool.close()


@pytest.mark.parametrize("impl", ["c", "python"])
def test_move_an_evicted_slice_pages_stay_until_a_miss_moves_them_in_unzeroed(model, impl):
    path, data = model
    pool = _move_pool(impl, 2 * 5 * PAGE)  # room for two evicted slices' pages (4 whole pages each), not three
    res = Reservation(N_EXPERT * NB2, OFF, pool)
    vmas0 = _vmas(res)
    for e in range(5):
        assert pool.attach(res.addr_of(_slice(e)[0]), NB2) == 0  # nothing evicted yet: fresh pages, as before
        _read(res, path, e)
    old = _whole_pages(res, 1)
    res.release(*_slice(1))  # kept where it is, bytes and all
    assert _whole_pages(res, 1) == old and pool.stats()["pool_detached"] == 1
    assert pool.attach(res.addr_of(_slice(6)[0]), NB2) == 1  # moved into the miss: the evicted slice's bytes, unzeroed
    got = _whole_pages(res, 6)
    n = min(len(got), len(old))
    assert got[:n] == old[:n], "the moved pages are not the evicted slice's"
    assert _whole_pages(res, 1) == bytes(len(old)), "the evicted slice still holds pages after they were moved"
    _read(res, path, 6)
    assert _bytes(res, 6) == data[slice(*_slice(6))]
    for e in (0, 2):  # a slice evicted and missed again takes its own pages back, in place
        res.release(*_slice(e))
    assert pool.attach(res.addr_of(_slice(2)[0]), NB2) == 1
    _read(res, path, 2)
    res.release(*_slice(3))
    res.release(*_slice(4))  # over the cap (slices 0 and 3 held): released as without the pool
    st = pool.stats()
    assert (st["pool_recycled"], st["pool_fallback"], st["pool_detached"], st["pool_dontneed"], st["pool_errors"]) == \
        (2, 5, 4, 1, 0), st
    assert st["pool_attached"] == 2 and st["pool_bytes"] == 2 * 4 * PAGE
    assert _whole_pages(res, 4) == bytes(len(_whole_pages(res, 4)))
    for e in (0, 2, 3, 6):
        assert _bytes(res, e) == data[slice(*_slice(e))], f"slice {e} changed"
    assert _vmas(res) == vmas0, "the move kind added mappings"
    pool.close()


@pytest.mark.parametrize("kind", ["move", "memfd"])
@pytest.mark.parametrize("lanes", ["c", "python"])
def test_the_read_lanes_attach_before_they_read(model, monkeypatch, lanes, kind):
    """Through a SliceReader: its lanes (compiled: clanes.c, no GIL; Python: reader._read) attach a chunk before each
    read into a registered reservation; evictions release through the pool; every byte is the file's."""
    path, data = model
    monkeypatch.setattr(clanes, "_lib", False)
    monkeypatch.setattr(clanes, "_python", lanes == "python")
    r = SliceReader([path], 3, odirect=False)
    assert r.lanes_impl == lanes
    try:
        pool = r.recycle(kind, 4 * CHUNK)
        res = Reservation(N_EXPERT * NB2, OFF, pool)
        reads = [(a, NB2, res.addr_of(a), None) for a in [_slice(e)[0] for e in range(4)]]
        r.submit_many(path, reads).result()
        for e in range(4):
            assert _bytes(res, e) == data[slice(*_slice(e))]
        for e in (0, 1):
            res.release(*_slice(e))
        r.submit_many(path, [(_slice(e)[0], NB2, res.addr_of(_slice(e)[0]), None) for e in (6, 7)]).result()
        for e in (2, 3, 6, 7):
            assert _bytes(res, e) == data[slice(*_slice(e))]
        st = pool.stats()
        assert (st["pool_fresh"], st["pool_recycled"], st["pool_detached"]) == ((4, 2, 2) if kind == "memfd" else
                                                                               (0, 2, 2)), st
        tids = r.lane_tids()
        assert len(tids) == 3 and all(t > 0 for t in tids)
        user, system = sysstats.thread_cpu(tids)
        assert user >= 0 and system >= 0
    finally:
        r.close()


def test_the_pool_holds_the_budget_and_the_release_batch_the_cgroup_check_counts():
    from harness.engine.cache.budget import CapFit, release_slack

    slack = release_slack(4, 6, [0, 3 << 20, 3 << 20])
    assert slack == 4 * 6 * (3 << 20)
    fit = CapFit(448 << 20, 0, 160 << 20, 60 << 20, 30 << 20, slack)
    # what a pool may hold is what the fit check already counts: memfd every recycled slice, move the evicted ones
    assert recycle.pool_cap("memfd", 160 << 20, slack) == fit.budget + fit.release
    assert recycle.pool_cap("move", 160 << 20, slack) == fit.release


def test_the_probe_measures_every_candidate_on_a_real_model_file(tmp_path, capsys):
    """harness.engine.diag.recycle_probe (the candidates side by side, issue 25) on a generated model: each candidate
    runs, the pools recycle without an error, and the figures are there (one JSON line per candidate)."""
    from harness.engine.diag import recycle_probe
    from harness.synth import ModelSpec, make_model

    (model,) = make_model(tmp_path / "m.gguf", ModelSpec(expert_type="q4_k", seed=1))
    recycle_probe.main([str(model), "--misses", "40", "--resident", "4", "--no-odirect"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["candidate"] for r in rows] == list(recycle_probe.CANDIDATES)
    for r in rows:
        assert r["mib_read"] > 0 and r["read_sys_ms_per_mib"] >= 0 and r["vmas"] > 0
        if r["candidate"] in ("move", "memfd", "memfd-lazy"):
            assert r["pool_recycled"] > 0 and r["pool_errors"] == 0, r
