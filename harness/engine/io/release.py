"""The page releaser: evicted slices' pages are released on one thread, off the compute thread, handed over in
batches of a few layers' evictions (`every` layers, or sooner once a batch holds `max_bytes`: a prompt's layer
evicts hundreds of MiB at once, which must not wait for three more layers; and at each token's end): one wake-up
of the releaser thread per batch,
not per layer (waking a sleeping thread cost the compute thread tens of us per call on this VM, where it is an
interrupt between virtual CPUs: ThreadPoolExecutor.submit was ~12% of the hook's own CPU time at the 30B shape,
py-spy). A batch still open holds at most `every` layers' evicted pages (under `max_bytes` and a layer) a little
longer; a key waiting in one is
waited for (`wait`, which hands the batch over first) before its slices are read again.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any


def batch_layers(read_ahead: bool) -> int:
    """How many layers' evictions a batch gathers: one at a time with read-ahead (a prefetch of a key still in an open
    batch must wait for it; by hand, 30B shape, --prefetch 1 --predict-prefetch, 2 runs each: mgmt 78-83 ms/token
    batching 4 layers, 58-60 one by one; lru without read-ahead 22-25 both), else 4."""
    return 1 if read_ahead else 4


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
