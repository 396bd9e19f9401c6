"""The page releaser (harness.engine.io.release): batches of `every` layers are handed to its thread in order;
waiting on a key's batch hands an open batch over first (never a wait on work the thread was not given); a
failure is the batch's, raised where it is waited for."""

from __future__ import annotations

import threading

import pytest

from harness.engine.io.release import PageReleaser


def test_batches_go_every_n_layers_in_order_and_wait_hands_an_open_one_over():
    ran: list[list[int]] = []
    gate = threading.Event()

    def run(work: list[int]) -> None:
        gate.wait(5)
        ran.append(list(work))

    d = PageReleaser(run, every=3)
    try:
        b1 = d.add([1])
        assert d.add([2, 3]) is b1 and d.add([4]) is b1  # the third layer hands it over
        b2 = d.add([5])
        assert b2 is not b1 and not b2.done()
        gate.set()
        b1.result()
        assert ran == [[1, 2, 3, 4]] and not b2.done()  # still open: nothing runs it until it is handed over
        d.wait(b2)  # hands it over, then waits
        assert b2.done() and ran == [[1, 2, 3, 4], [5]]
    finally:
        d.close()


def test_a_batch_over_max_bytes_goes_at_once():
    ran: list[list[int]] = []
    d = PageReleaser(lambda work: ran.append(list(work)), every=4, max_bytes=100)
    try:
        small = d.add([1], 40)
        big = d.add([2], 60)  # 100 bytes held: handed over now, not after two more layers
        assert big is small
        big.result()
        assert ran == [[1, 2]]
    finally:
        d.close()


def test_a_failure_is_raised_where_its_batch_is_waited_for():
    def run(work: list[int]) -> None:
        raise OSError(12, "madvise failed")

    d = PageReleaser(run, every=1)
    try:
        b = d.add([1])
        with pytest.raises(OSError, match="madvise failed"):
            d.wait(b)
        assert b.done() and isinstance(b.exception(), OSError)
        b2 = d.add([2])  # the thread goes on after a failure: the next batch runs (and fails) too
        with pytest.raises(OSError):
            d.wait(b2)
    finally:
        d.close()
