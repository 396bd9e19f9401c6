"""The read lanes' two priorities, with real threads and real file reads: demand reads go before queued
speculative ones, speculative reads are bounded and leave a lane to demand, a queued one can be promoted or
withdrawn, and the bytes that land are the file's."""

from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import Future, wait

import pytest

from harness.engine.lanes import PriorityLanes
from harness.engine.reader import SliceReader, default_spec_max

SLICE = 65536
N = 16
T = 10.0  # generous timeout: the machine is shared


@pytest.fixture
def model_file(tmp_path):
    p = tmp_path / "slices.bin"
    p.write_bytes(os.urandom(SLICE * N))
    return p


class Reads:
    """Real slice reads into buffers, recording the order in which they finish."""

    def __init__(self, reader: SliceReader, path):
        self.reader, self.path = reader, path
        self.done: list[str] = []
        self.bufs: dict[str, ctypes.Array] = {}

    def submit(self, tag: str, i: int, speculative: bool = False) -> Future:
        buf = ctypes.create_string_buffer(SLICE)
        self.bufs[tag] = buf
        go = self.reader.submit_speculative if speculative else self.reader.submit
        f = go(self.path, i * SLICE, SLICE, ctypes.addressof(buf))
        f.add_done_callback(lambda _f: self.done.append(tag))
        return f

    def check(self, tag: str, i: int) -> None:
        assert self.bufs[tag].raw == self.path.read_bytes()[i * SLICE:(i + 1) * SLICE]


def _block(lanes: PriorityLanes) -> threading.Event:
    """Occupy one lane with a demand job until the returned event is set."""
    gate, started = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        gate.wait(T)

    lanes.submit(hold)
    assert started.wait(T)
    return gate


def test_demand_reads_go_before_queued_speculative_ones(model_file):
    r = SliceReader([model_file], 1, odirect=False)
    try:
        reads = Reads(r, model_file)
        gate = _block(r.pool)
        futs = [reads.submit(f"s{i}", i, speculative=True) for i in range(4)]
        futs += [reads.submit(f"d{i}", 8 + i) for i in range(4)]
        gate.set()
        wait(futs, T)
        assert reads.done == ["d0", "d1", "d2", "d3", "s0", "s1", "s2", "s3"]
        for i in range(4):
            reads.check(f"s{i}", i)
            reads.check(f"d{i}", 8 + i)
        assert all(f.result()[0] == SLICE for f in futs)
    finally:
        r.close()


def test_promote_moves_a_queued_speculative_read_ahead_of_the_others(model_file):
    r = SliceReader([model_file], 1, odirect=False)
    try:
        reads = Reads(r, model_file)
        gate = _block(r.pool)
        s = [reads.submit(f"s{i}", i, speculative=True) for i in range(3)]
        d = reads.submit("d0", 5)
        r.promote(s[2])
        gate.set()
        wait([*s, d], T)
        assert reads.done == ["d0", "s2", "s0", "s1"]
        reads.check("s2", 2)
    finally:
        r.close()


def test_withdraw_cancels_queued_speculative_reads_all_or_none(model_file):
    r = SliceReader([model_file], 1, odirect=False)
    try:
        reads = Reads(r, model_file)
        gate = _block(r.pool)
        a, b, c = (reads.submit(f"s{i}", i, speculative=True) for i in range(3))
        d = reads.submit("d0", 4)
        assert r.withdraw([a, b]) and a.cancelled() and b.cancelled()
        assert not r.withdraw([c, d])  # d is a demand read: nothing changes
        assert not c.cancelled()
        gate.set()
        wait([c, d], T)
        assert reads.done[-2:] == ["d0", "s2"] and not r.withdraw([c])  # done: not withdrawn
        reads.check("s2", 2)
    finally:
        r.close()


def test_speculative_reads_are_bounded_and_leave_a_lane_to_demand(model_file):
    """3 lanes: at most 2 speculative jobs run at once, and a demand read finishes while both still hold
    their lanes."""
    assert default_spec_max(3) == 2 and default_spec_max(1) == 1
    r = SliceReader([model_file], 3, odirect=False)
    lock, running, peak = threading.Lock(), [0], [0]
    gate = threading.Event()

    def spec_job() -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        gate.wait(T)
        with lock:
            running[0] -= 1

    try:
        specs = [r.pool.submit(spec_job, speculative=True) for _ in range(5)]
        reads = Reads(r, model_file)
        d = reads.submit("d0", 3)
        assert d.result(T)[0] == SLICE  # with both speculative jobs still waiting on the gate
        reads.check("d0", 3)
        assert running[0] == 2 and r.pool.spec_queued == 3
        gate.set()
        wait(specs, T)
        assert peak[0] == 2
    finally:
        gate.set()
        r.close()


def test_a_demand_read_waits_for_at_most_one_running_speculative_read(model_file):
    """Every lane busy with a speculative job (spec_max = lanes): a demand read waits only until one of them
    ends, then goes before the speculative reads still queued."""
    r = SliceReader([model_file], 2, odirect=False, spec_max=2)
    gates = [threading.Event(), threading.Event()]
    started = [threading.Event(), threading.Event()]

    def spec_job(i: int) -> None:
        started[i].set()
        gates[i].wait(T)

    try:
        held = [r.pool.submit(spec_job, i, speculative=True) for i in range(2)]
        assert all(s.wait(T) for s in started)
        reads = Reads(r, model_file)
        queued = reads.submit("s_q", 1, speculative=True)
        d = reads.submit("d0", 2)
        gates[0].set()
        assert d.result(T)[0] == SLICE
        assert not queued.done() or reads.done.index("d0") < reads.done.index("s_q")
        gates[1].set()
        wait([*held, queued], T)
        assert reads.done == ["d0", "s_q"]
    finally:
        for g in gates:
            g.set()
        r.close()


def test_close_cancels_queued_speculative_reads_and_finishes_demand_ones(model_file):
    r = SliceReader([model_file], 1, odirect=False)
    reads = Reads(r, model_file)
    gate = _block(r.pool)
    s = reads.submit("s0", 0, speculative=True)
    d = reads.submit("d0", 1)
    threading.Timer(0.2, gate.set).start()
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
