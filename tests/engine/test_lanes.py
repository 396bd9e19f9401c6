"""The read lanes' two priorities, with real threads and real file reads: demand reads go before queued
speculative ones, speculative reads are bounded and leave a lane to demand, a queued one can be promoted or
withdrawn, and the bytes that land are the file's."""

from __future__ import annotations

import ctypes
import os
import threading

import pytest

from harness.engine.io.lanes import PriorityLanes
from harness.engine.io.reader import SliceReader, default_spec_max
from tests.helpers.lanes import Hold, impl_fixture  # noqa: F401 - the `impl` fixture

SLICE = 65536
N = 16
T = 10.0  # generous timeout: the machine is shared


@pytest.fixture
def model_file(tmp_path):
    p = tmp_path / "slices.bin"
    p.write_bytes(os.urandom(SLICE * N))
    return p


class Finished:
    """A reader's recorder (as --io-trace's): when each tagged read finished."""

    def __init__(self) -> None:
        self.t1: dict[int, int] = {}

    def read_done(self, rid: int, started_ns: int, finished_ns: int, nbytes: int, lane: int | None = None) -> None:
        self.t1[rid] = finished_ns


class Reads:
    """Real slice reads into buffers; `done` lists the tags of the collected reads in the order they finished."""

    def __init__(self, reader: SliceReader, path):
        self.reader, self.path = reader, path
        self.rec = Finished()
        reader.recorder = self.rec
        self.bufs: dict[str, ctypes.Array] = {}
        self.tags: dict[int, str] = {}

    def submit(self, tag: str, i: int, speculative: bool = False):
        buf = ctypes.create_string_buffer(SLICE)
        self.bufs[tag] = buf
        self.tags[len(self.tags)] = tag
        go = self.reader.submit_speculative if speculative else self.reader.submit
        return go(self.path, i * SLICE, SLICE, ctypes.addressof(buf), len(self.tags) - 1)

    @property
    def done(self) -> list[str]:
        return [self.tags[k] for k in sorted(self.rec.t1, key=self.rec.t1.get)]

    def check(self, tag: str, i: int) -> None:
        assert self.bufs[tag].raw == self.path.read_bytes()[i * SLICE:(i + 1) * SLICE]


def wait(futs, timeout=None) -> None:
    for f in futs:
        if not f.cancelled():
            f.result()


def _block(r: SliceReader) -> Hold:
    """Occupy the one lane with a demand job until hold.release(0)."""
    h = Hold(r)
    h.submit(0)
    h.wait_holding(1)
    return h


def test_demand_reads_go_before_queued_speculative_ones(model_file, impl):
    r = SliceReader([model_file], 1, odirect=False)
    try:
        reads = Reads(r, model_file)
        gate = _block(r)
        futs = [reads.submit(f"s{i}", i, speculative=True) for i in range(4)]
        futs += [reads.submit(f"d{i}", 8 + i) for i in range(4)]
        gate.release(0)
        wait(futs, T)
        assert reads.done == ["d0", "d1", "d2", "d3", "s0", "s1", "s2", "s3"]
        for i in range(4):
            reads.check(f"s{i}", i)
            reads.check(f"d{i}", 8 + i)
        assert all(f.result()[0] == SLICE for f in futs)
    finally:
        r.close()


def test_promote_moves_a_queued_speculative_read_ahead_of_the_others(model_file, impl):
    r = SliceReader([model_file], 1, odirect=False)
    try:
        reads = Reads(r, model_file)
        gate = _block(r)
        s = [reads.submit(f"s{i}", i, speculative=True) for i in range(3)]
        d = reads.submit("d0", 5)
        r.promote(s[2])
        gate.release(0)
        wait([*s, d], T)
        assert reads.done == ["d0", "s2", "s0", "s1"]
        reads.check("s2", 2)
    finally:
        r.close()


def test_withdraw_cancels_queued_speculative_reads_all_or_none(model_file, impl):
    r = SliceReader([model_file], 1, odirect=False)
    try:
        reads = Reads(r, model_file)
        gate = _block(r)
        a, b, c = (reads.submit(f"s{i}", i, speculative=True) for i in range(3))
        d = reads.submit("d0", 4)
        assert r.withdraw([a, b]) and a.cancelled() and b.cancelled()
        assert not r.withdraw([c, d])  # d is a demand read: nothing changes
        assert not c.cancelled()
        gate.release(0)
        wait([c, d], T)
        assert reads.done[-2:] == ["d0", "s2"] and not r.withdraw([c])  # done: not withdrawn
        reads.check("s2", 2)
    finally:
        r.close()


def test_speculative_reads_are_bounded_and_leave_a_lane_to_demand(model_file, impl):
    """3 lanes: at most 2 speculative jobs run at once, and a demand read finishes while both still hold
    their lanes."""
    assert default_spec_max(3) == 2 and default_spec_max(1) == 1
    r = SliceReader([model_file], 3, odirect=False)
    h = Hold(r)
    try:
        specs = [h.submit(1, speculative=True) for _ in range(5)]
        h.wait_holding(2)
        reads = Reads(r, model_file)
        d = reads.submit("d0", 3)
        assert d.result(T)[0] == SLICE  # with both speculative jobs still holding their lanes
        reads.check("d0", 3)
        assert h.state()[0] == 2 and h.state()[2] == 3
        h.release(1)
        wait(specs, T)
        assert h.state()[1] == 2
    finally:
        h.release(1)
        r.close()


def test_a_demand_read_waits_for_at_most_one_running_speculative_read(model_file, impl):
    """Every lane busy with a speculative job (spec_max = lanes): a demand read waits only until one of them
    ends, then goes before the speculative reads still queued."""
    r = SliceReader([model_file], 2, odirect=False, spec_max=2)
    h = Hold(r)
    try:
        held = [h.submit(i, speculative=True) for i in range(2)]
        h.wait_holding(2)
        reads = Reads(r, model_file)
        queued = reads.submit("s_q", 1, speculative=True)
        d = reads.submit("d0", 2)
        h.release(0)
        assert d.result(T)[0] == SLICE
        h.release(1)
        wait([*held, queued], T)
        assert reads.done == ["d0", "s_q"]
    finally:
        h.release(0)
        h.release(1)
        r.close()


def test_close_cancels_queued_speculative_reads_and_finishes_demand_ones(model_file, impl):
    r = SliceReader([model_file], 1, odirect=False)
    reads = Reads(r, model_file)
    gate = _block(r)
    s = reads.submit("s0", 0, speculative=True)
    d = reads.submit("d0", 1)
    threading.Timer(0.2, gate.release, args=(0,)).start()
    r.close()
    assert s.cancelled() and d.result()[0] == SLICE
    reads.check("d0", 1)


def test_a_failed_job_hands_its_exception_to_the_waiter():
    lanes = PriorityLanes(1, 1)
    try:
        f = lanes.submit(lambda: 1 / 0, speculative=True)
        with pytest.raises(ZeroDivisionError):
            f.result(T)
        assert lanes.submit(lambda: 7).result(T) == 7  # the lane survives
    finally:
        lanes.close()
