"""Helpers for tests that run on both read-lane implementations: the Python lanes (harness.engine.io.lanes) and the
compiled ones (harness.engine.io.clanes), chosen as the engine chooses them, by clanes.use_python (the CLI's
BMOE_PURE_PYTHON_LANES; the `impl` fixture in tests/engine/conftest.py)."""

from __future__ import annotations

import threading
import time

from harness.engine.io.reader import SliceReader

T = 10.0


class Hold:
    """Jobs that occupy a lane until released, on either implementation."""

    def __init__(self, r: SliceReader):
        self.r = r
        self.gates: dict[int, threading.Event] = {}
        self.started: dict[int, threading.Event] = {}
        self.lock, self.running, self.peak = threading.Lock(), [0], [0]

    def submit(self, i: int, speculative: bool = False):
        if self.r._c is not None:
            return self.r._c.submit_hold(i, speculative)
        self.gates[i], self.started[i] = threading.Event(), threading.Event()

        def hold() -> None:
            with self.lock:
                self.running[0] += 1
                self.peak[0] = max(self.peak[0], self.running[0])
            self.started[i].set()
            self.gates[i].wait(T)
            with self.lock:
                self.running[0] -= 1

        return self.r.pool.submit(hold, speculative=speculative)

    def release(self, i: int) -> None:
        if self.r._c is not None:
            self.r._c.release_hold(i)
        else:
            self.gates[i].set()

    def state(self) -> tuple[int, int, int]:
        """(holding now, most at once, speculative jobs queued)."""
        if self.r._c is not None:
            return self.r._c.holding()
        with self.lock:
            return self.running[0], self.peak[0], self.r.pool.spec_queued

    def wait_holding(self, n: int) -> None:
        deadline = time.monotonic() + T
        while self.state()[0] < n:
            assert time.monotonic() < deadline, "the hold jobs did not start"
            time.sleep(0.005)
