"""One helper thread for a layer batch's eviction decision, so it runs while the layer's reads and matmuls do,
off the compute thread (`--no-evict-thread`: on the compute thread, as before).

The hook hands it one job at a time (`submit`) at the layer's first expert-matmul ask, and takes the result
(`join`) before anything reads the cache again: the next layer's lookups, the token's counters. The cache is
touched by one thread at a time, in the same order as on the compute thread, so every decision is the same.
Two plain locks are the hand-off (a lock's release and acquire are one C call each; a Condition is Python),
not a one-worker ThreadPoolExecutor: an empty job's submit + join cost the calling thread 6-8.5 us of CPU here
against the executor's submit + result 17-23 us (20000 round trips, 3 rounds, warm, 2-core VM): ~1 ms per token
less at 48 layers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Evictor:
    def __init__(self) -> None:
        self._go = threading.Lock()
        self._go.acquire()  # released by submit: the thread takes the job
        self._done = threading.Lock()
        self._done.acquire()  # released by the thread when the job is done
        self._job: Callable[[], None] | None = None
        self._pending = False
        self._cpu_ns = 0
        self._exc: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="bmoe-evictor", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> bool:
        return self._pending

    def submit(self, job: Callable[[], None]) -> None:
        if self._pending:
            raise RuntimeError("evictor: a job is still pending")
        self._job, self._pending = job, True
        self._go.release()

    def join(self) -> int:
        """Wait for the pending job (if any); the CPU time it took on the helper thread (ns). Its exception,
        if it raised one, is raised here."""
        if not self._pending:
            return 0
        self._done.acquire()
        self._pending = False
        exc, self._exc = self._exc, None
        if exc is not None:
            raise exc
        return self._cpu_ns

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.join()
        finally:
            self._closed = True
            self._job = None
            self._go.release()
            self._thread.join()

    def _loop(self) -> None:
        thread_ns = time.thread_time_ns
        while True:
            self._go.acquire()
            job = self._job
            if job is None:
                return
            c0 = thread_ns()
            try:
                job()
            except BaseException as e:  # noqa: BLE001 - handed to the compute thread at join
                self._exc = e
            self._cpu_ns = thread_ns() - c0
            self._done.release()
