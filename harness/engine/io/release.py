"""The page releaser: evicted slices' pages are released on one thread, off the compute thread, handed over in
batches (`every` layers' evictions, or sooner once a batch holds `max_bytes`: a prompt's layer evicts hundreds of MiB
at once; and at each token's end). Batches of 4 layers were once chosen to save the compute thread wake-ups of the
releaser (tens of us each on this VM); the engine now hands over every layer (BATCH_LAYERS below): measured side by
side, cache management's wall and CPU shares did not grow (3.3 / 1.8% of the token with 4, 3.0 / 1.7% with 1) and 4
layers' evicted pages are no longer held. A batch still open holds `every` layers' evicted pages (under `max_bytes`) a
little longer; a key waiting in one is waited for (`wait`, which hands the batch over first) before its slices are
read again.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

# How many layers' evictions a release batch gathers: one. With read-ahead one is faster (a prefetch of a key still in
# an open batch must wait for it; by hand, 30B shape, --prefetch 1 --predict-prefetch, 2 runs each: mgmt 78-83 ms/token
# batching 4 layers, 58-60 one by one); without it batching 4 gained nothing (lru: mgmt 22-25 ms both; decode tok/s
# 1.00x [0.91, 1.11], bench-data/2026-12-04-release-batch-30b) and held 4 layers' evicted pages: at the 30B shape with
# a 2000 MiB cache the minimum cap fell from 3168 to 3104 MiB (bench-data/2026-12-04-mincap-30b).
BATCH_LAYERS = 1


class ReleaseBatch:
    """Some layers' evictions: `done()` once their pages are released; `result()` waits and raises the failure."""

    __slots__ = ("work", "_done", "_exc")

    def __init__(self) -> None:
        self.work: list[Any] = []
        self._done = threading.Event()
        self._exc: BaseException | None = None

    def done(self) -> bool:
        return self._done.is_set()

    def exception(self) -> BaseException | None:
        """The failure of a finished batch (call after done())."""
        return self._exc

    def result(self) -> None:
        if not self._done.is_set():  # a released batch (the usual case when a key is re-read) takes no lock
            self._done.wait()
        if self._exc is not None:
            raise self._exc


class PageReleaser:
    """One thread running `run(work items)` for each handed-over batch, in order."""

    def __init__(self, run: Callable[[list[Any]], None], every: int = 4, max_bytes: int = 64 << 20):
        self._run = run
        self.every, self.max_bytes = every, max_bytes
        self._bytes = 0
        self._q: queue.SimpleQueue[ReleaseBatch | None] = queue.SimpleQueue()
        self._open: ReleaseBatch | None = None
        self._layers = 0
        self._t = threading.Thread(target=self._main, name="bmoe-evict", daemon=True)
        self._t.start()

    def add(self, work: list[Any], nbytes: int = 0) -> ReleaseBatch:
        """One layer's evictions (`nbytes` of pages), into the open batch: handed over every `every` calls, or
        once it holds `max_bytes`."""
        b = self._open
        if b is None:
            b = self._open = ReleaseBatch()
        b.work.extend(work)
        self._layers += 1
        self._bytes += nbytes
        if self._layers >= self.every or self._bytes >= self.max_bytes:
            self.flush()
        return b

    @property
    def tid(self) -> int:
        """The releaser thread's id (its CPU time: sysstats.thread_cpu)."""
        return self._t.native_id or 0

    def flush(self) -> None:
        """Hand the open batch over now."""
        b = self._open
        if b is not None:
            self._open, self._layers, self._bytes = None, 0, 0
            self._q.put(b)

    def wait(self, b: ReleaseBatch) -> None:
        """Until `b`'s pages are released (handing it over first if it is still open); raises its failure."""
        if b is self._open:
            self.flush()
        b.result()

    def close(self) -> None:
        self.flush()
        self._q.put(None)
        self._t.join()

    def _main(self) -> None:
        while (b := self._q.get()) is not None:
            try:
                self._run(b.work)
            except BaseException as e:  # noqa: BLE001 - reported by whoever waits on the batch
                b._exc = e
            finally:
                b._done.set()
