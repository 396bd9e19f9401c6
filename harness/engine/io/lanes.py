"""Read lanes with two priorities: demand jobs always go first, speculative ones only fill idle lanes.

A fixed set of worker threads takes jobs from two FIFO queues. A free lane takes the oldest demand job; only
when no demand job is queued does it take a speculative one, and then only while fewer than `spec_max`
speculative jobs are running. Running jobs are never interrupted, so a demand job waits at most for one
already-running job to end on some lane (with `spec_max` below the lane count, a lane is always left for
demand). A queued speculative job can be promoted to the demand queue (a demand read now needs its bytes)
or cancelled through its future (nothing needs it any more). No I/O knowledge here: the jobs are callables.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any


@dataclass(eq=False)
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    future: Future
    speculative: bool


class PriorityLanes:
    """`lanes` worker threads (named `<prefix>_<i>`, as a ThreadPoolExecutor names them)."""

    def __init__(self, lanes: int, spec_max: int, prefix: str = "bmoe-io"):
        if lanes < 1 or spec_max < 1:
            raise ValueError("lanes and spec_max must be >= 1")
        self.lanes = lanes
        self.spec_max = spec_max
        self._cv = threading.Condition()
        self._demand: deque[_Job] = deque()
        self._spec: deque[_Job] = deque()
        self._spec_running = 0
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{prefix}_{i}", daemon=True) for i in range(lanes)]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[..., Any], *args: Any, speculative: bool = False) -> Future:
        fut: Future = Future()
        job = _Job(fn, args, fut, speculative)
        with self._cv:
            if self._closed:
                raise RuntimeError("submit after close")
            (self._spec if speculative else self._demand).append(job)
            self._cv.notify()
        return fut

    def promote(self, fut: Future) -> bool:
        """Move a still-queued speculative job to the end of the demand queue; False when it is not queued
        (running, done or cancelled)."""
        with self._cv:
            for job in self._spec:
                if job.future is fut:
                    self._spec.remove(job)
                    job.speculative = False
                    self._demand.append(job)
                    self._cv.notify()
                    return True
        return False

    def withdraw(self, futs: list[Future]) -> bool:
        """Cancel queued speculative jobs all together, or none of them: True when every one was still queued
        (then none will run), False when any is running, done or not speculative (then nothing changed)."""
        with self._cv:
            queued = {id(j.future): j for j in self._spec}
            if not all(id(f) in queued for f in futs):
                return False
            for f in futs:
                self._spec.remove(queued[id(f)])
                f.cancel()
            return True

    @property
    def spec_queued(self) -> int:
        with self._cv:
            return len(self._spec)

    def _take(self) -> _Job | None:
        with self._cv:
            while True:
                if self._demand:
                    return self._demand.popleft()
                if self._spec and self._spec_running < self.spec_max:
                    self._spec_running += 1
                    return self._spec.popleft()
                if self._closed and not self._demand and not self._spec:
                    return None
                self._cv.wait()

    def _work(self) -> None:
        while True:
            job = self._take()
            if job is None:
                return
            try:
                if job.future.set_running_or_notify_cancel():
                    try:
                        job.future.set_result(job.fn(*job.args))
                    except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the future
                        job.future.set_exception(e)
            finally:
                if job.speculative:
                    with self._cv:
                        self._spec_running -= 1
                        self._cv.notify()

    def close(self) -> None:
        """Cancel the queued speculative jobs, finish the demand ones, stop the threads."""
        with self._cv:
            self._closed = True
            for job in self._spec:
                job.future.cancel()
            self._cv.notify_all()
        for t in self._threads:
            t.join()
