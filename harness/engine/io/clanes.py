"""The compiled read lanes (clanes.c, loaded with ctypes): the same two priorities as harness.engine.io.lanes, with
the reads done by pthreads that never take the GIL, and waited for with the GIL released.

`CLanes.register` tells the lanes a routed-expert tensor once (its file, the file position and address of expert
0's slice, the slice size); `CLanes.submit_layer` then queues a layer's misses of several registered tensors in one
call in which C computes each read (as `submit_groups` given them: the same groups, reads and order), so the
hook's thread builds no read lists. A library older than LAYER_VERSION has no such call (`CLanes.layer` False).
`CLanes.submit` hands a group of reads of one file to the lanes in one call and returns a `LaneRead`, which
behaves as the part of a `concurrent.futures.Future` the engine uses: `result()` (bytes read, read ns, summed
over the group; raises the first failed read's error, as the Python lanes do), `done()`, `cancel()`,
`cancelled()`, `exception()`. Read errors come back as errno and position and become `reader.read_error`'s
one-line message. `BMOE_PURE_PYTHON_LANES=1`, or a build without the library, selects the Python lanes
(identical bytes). Times are CLOCK_MONOTONIC ns, as `time.perf_counter_ns` on Linux.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError

from harness.engine import native

VERSION = 3  # the oldest library used: 3, bmoe_lanes_submit_groups
LAYER_VERSION = 4  # 4: bmoe_lanes_register, bmoe_lanes_submit_layer (an older library: CLanes.layer is False)
POOL_VERSION = 5  # 5: the page pool of --recycle-pages (clanes_pool.c), bmoe_lanes_set_pool, bmoe_lanes_tids
_i64, _vp, _int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
ERR_SHORT = -1
_INT = ctypes.sizeof(_int)
def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.bmoe_lanes_new.restype = _vp
    lib.bmoe_lanes_new.argtypes = [_int, _int, _int, _vp, _vp, _vp]
    lib.bmoe_lanes_submit.restype = _vp
    lib.bmoe_lanes_submit.argtypes = [_vp, _int, _int, _vp, _int]
    lib.bmoe_lanes_submit1.restype = _vp
    lib.bmoe_lanes_submit_groups.restype = _int
    lib.bmoe_lanes_submit_groups.argtypes = [_vp, _int, _vp, _vp, _vp, _int, _vp]
    lib.bmoe_lanes_submit1.argtypes = [_vp, _int, _i64, _i64, ctypes.c_size_t, _int]
    for name in ("done", "promote", "cancel", "direct"):
        getattr(lib, f"bmoe_lanes_{name}").restype = _int
    lib.bmoe_lanes_done.argtypes = lib.bmoe_lanes_promote.argtypes = lib.bmoe_lanes_cancel.argtypes = [_vp, _vp]
    lib.bmoe_lanes_direct.argtypes = [_vp, _int]
    lib.bmoe_lanes_withdraw.restype = _int
    lib.bmoe_lanes_withdraw.argtypes = [_vp, _int, _vp]
    lib.bmoe_lanes_collect.argtypes = [_vp, _vp, _vp]
    lib.bmoe_lanes_detail.argtypes = [_vp, _int, _vp]
    lib.bmoe_lanes_release.argtypes = lib.bmoe_lanes_collect.argtypes[:2]
    lib.bmoe_lanes_close.argtypes = [_vp]
    lib.bmoe_lanes_submit_hold.restype = _vp
    lib.bmoe_lanes_submit_hold.argtypes = [_vp, _int, _int]
    lib.bmoe_lanes_release_hold.argtypes = [_vp, _int]
    lib.bmoe_lanes_holding.argtypes = [_vp, _vp]
    if lib.bmoe_lanes_version() >= LAYER_VERSION:
        lib.bmoe_lanes_register.restype = _int
        lib.bmoe_lanes_register.argtypes = [_vp, _int, _i64, _i64, ctypes.c_size_t]
        lib.bmoe_lanes_submit_layer.restype = _int
        lib.bmoe_lanes_submit_layer.argtypes = [_vp, _int, _vp, _int, _vp, _vp, _int]
        lib.bmoe_lanes_wake.argtypes = [_vp]
    if lib.bmoe_lanes_version() >= POOL_VERSION:
        from harness.engine.io.recycle import declare

        declare(lib)
        lib.bmoe_lanes_set_pool.argtypes = [_vp, _vp]
        lib.bmoe_lanes_tids.restype = _int
        lib.bmoe_lanes_tids.argtypes = [_vp, _vp]
    return lib


_lib: ctypes.CDLL | None | bool = False  # False: not looked for yet
_python = False  # use_python(True): the Python lanes even where the library is built


def use_python(on: bool) -> bool:
    """Force the Python lanes (on) or let the built library be used (off, the default): set by the CLI from
    BMOE_PURE_PYTHON_LANES=1, by a test directly. Returns the setting it replaced."""
    global _python
    old, _python = _python, on
    return old


def load() -> ctypes.CDLL | None:
    """The built library, or None (not built, too old, or the Python lanes forced: `use_python`)."""
    global _lib
    if _python:
        return None
    if _lib is False:
        path = native.library("clanes")
        lib = ctypes.CDLL(path) if path else None
        if lib is not None and lib.bmoe_lanes_version() < VERSION:
            lib = None
        if lib is not None:
            _declare(lib)
            # the calls that never block (submit, done, promote, cancel, withdraw, detail, release) keep the GIL:
            # a CDLL call drops it and must win it back, which waits while the page releaser's thread holds it (measured
            # with harness.engine.diag.mgmt_profile at the 30B shape: reader.submit_many 54 us wall per call, 30 CPU)
            lib.quick = _declare(ctypes.PyDLL(path))
        _lib = lib
    return _lib  # type: ignore[return-value]


# a group's failure as an OSError (reader.read_error), given (errno, pos, len)
ErrorOf = Callable[[int, int, int], BaseException]
# told each tagged read of a collected group: (tag, started_ns, finished_ns, bytes, lane)
DoneOf = Callable[[int, int, int, int, int], None]


class LaneRead:
    """One submitted group of reads (see the module docstring); safe to wait on from two threads."""

    __slots__ = ("_pool", "_g", "_tags", "_error_of", "_res", "_exc", "_cancelled", "_lock")

    def __init__(self, pool: CLanes, g: int, tags: Sequence[int | None] | None, error_of: ErrorOf):
        self._pool, self._g, self._tags, self._error_of = pool, g, tags, error_of
        self._res: tuple[int, int] | None = None
        self._exc: BaseException | None = None
        self._cancelled = False
        self._lock = threading.Lock()

    def _settled(self) -> bool:
        return self._res is not None or self._exc is not None or self._cancelled

    def _collect(self) -> None:
        with self._lock:
            if self._settled():
                return
            p = self._pool
            out = (_i64 * 6)()
            p.lib.bmoe_lanes_collect(p.handle, self._g, out)  # blocks with the GIL released
            got, ns, failed, fell, cancelled, done = out
            if fell >= 0:
                p.on_fellback()
            tags = self._tags
            if failed >= 0 or (tags is not None and p.on_done is not None):
                d = (_i64 * 8)()
                if tags is not None and p.on_done is not None:
                    for i, tag in enumerate(tags):
                        if tag is not None:
                            p.q.bmoe_lanes_detail(self._g, i, d)
                            if d[7] != 5:  # not cancelled
                                p.on_done(tag, d[1], d[2], d[0], d[3])
                if failed >= 0:
                    p.q.bmoe_lanes_detail(self._g, failed, d)
                    self._exc = self._error_of(d[4], d[5], d[6])
            p.q.bmoe_lanes_release(p.handle, self._g)
            self._g = 0
            if self._exc is None:
                if cancelled and not done:
                    self._cancelled = True
                else:
                    self._res = (got, ns)

    def result(self, timeout: float | None = None) -> tuple[int, int]:
        self._collect()
        if self._cancelled:
            raise CancelledError()
        if self._exc is not None:
            raise self._exc
        assert self._res is not None
        return self._res

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._collect()
        if self._cancelled:
            raise CancelledError()
        return self._exc

    def done(self) -> bool:
        with self._lock:
            return self._settled() or bool(self._pool.q.bmoe_lanes_done(self._pool.handle, self._g))

    def cancelled(self) -> bool:
        if not self._settled() and self.done():  # cancelled by close, or finished: settle it
            self._collect()
        return self._cancelled

    def cancel(self) -> bool:
        with self._lock:
            if self._settled():
                return self._cancelled
            p = self._pool
            if not p.q.bmoe_lanes_cancel(p.handle, self._g):
                return False
            p.q.bmoe_lanes_release(p.handle, self._g)
            self._g = 0
            self._cancelled = True
            return True

    def _promote(self) -> None:
        with self._lock:
            if not self._settled():
                self._pool.q.bmoe_lanes_promote(self._pool.handle, self._g)

    def __del__(self) -> None:
        g = self._g
        if g:
            self._g = 0
            self._pool.q.bmoe_lanes_release(self._pool.handle, g)


class CLanes:
    """`lanes` pthreads over the files (fd_buf[i], fd_direct[i] or -1, size[i]); `on_fellback` is called once a
    collected read tells that O_DIRECT failed with EINVAL and its file now reads buffered."""

    def __init__(self, lib: ctypes.CDLL, lanes: int, spec_max: int, files: list[tuple[int, int, int]],
                 on_fellback: Callable[[], None]):
        if lanes < 1 or spec_max < 1:
            raise ValueError("lanes and spec_max must be >= 1")
        self.lib = lib
        self.q = getattr(lib, "quick", lib)  # the non-blocking calls, GIL held (load())
        n = len(files)
        arr = lambda t, xs: (t * max(1, n))(*xs)  # noqa: E731
        self.handle = lib.bmoe_lanes_new(lanes, spec_max, n, arr(_int, [f[0] for f in files]),
                                         arr(_int, [f[1] for f in files]), arr(_i64, [f[2] for f in files]))
        if not self.handle:
            raise MemoryError("bmoe: the compiled read lanes could not start")
        self.on_fellback = on_fellback
        self.on_done: DoneOf | None = None
        self._closed = False
        self.layer = lib.bmoe_lanes_version() >= LAYER_VERSION  # register and submit_layer are there
        self._reg_error_of: list[ErrorOf] = []  # by registered tensor id
        self._layer_lock = threading.Lock()  # submit_layer's argument buffers, filled in place (cheaper than new
        self._scratch(256)  # ctypes arrays per call: measured in harness.engine.diag.mgmt_profile at the 30B shape)

    def _scratch(self, n: int) -> None:
        """submit_layer's buffers for up to n tensor ids + expert ids and n groups."""
        self._ints, self._outs = (_int * n)(), (_vp * n)()
        self._ints_at, self._outs_at = ctypes.addressof(self._ints), ctypes.addressof(self._outs)

    def submit(self, file: int, flat: Sequence[int], tags: Sequence[int | None] | None,
               error_of: ErrorOf, speculative: bool = False) -> LaneRead:
        """One group of reads of file `file`: flat = pos, len, addr of each read in turn."""
        n = len(flat) // 3
        g = self.q.bmoe_lanes_submit(self.handle, file, n, (_i64 * (3 * n))(*flat), int(speculative))
        if not g:
            raise RuntimeError("submit after close")
        return LaneRead(self, g, tags, error_of)

    def submit_groups(self, files: Sequence[int], counts: Sequence[int], flat: Sequence[int],
                      tags: Sequence[Sequence[int | None] | None], error_of: Sequence[ErrorOf]) -> list[LaneRead]:
        """Several groups (a layer's tensors) in one call: group j reads counts[j] slices of files[j], its
        pos, len, addr in turn in `flat`; one lock and one wake for all."""
        n = len(files)
        out = (_vp * n)()
        if not self.q.bmoe_lanes_submit_groups(self.handle, n, (_int * n)(*files), (_int * n)(*counts),
                                               (_i64 * len(flat))(*flat), 0, out):
            raise RuntimeError("submit after close")
        return [LaneRead(self, out[j], tags[j], error_of[j]) for j in range(n)]

    def register(self, file: int, pos0: int, nb2: int, addr0: int, error_of: ErrorOf) -> int:
        """A tensor of file `file` whose expert e's slice is nb2 bytes at pos0 + e * nb2, read to addr0 + e * nb2:
        its id for submit_layer (needs `layer`)."""
        tid = self.lib.bmoe_lanes_register(self.handle, file, pos0, nb2, addr0)
        if tid < 0:
            raise MemoryError("bmoe: the compiled read lanes could not register a tensor")
        assert tid == len(self._reg_error_of)
        self._reg_error_of.append(error_of)
        return tid

    def submit_layer(self, ids: Sequence[int], experts: Sequence[int]) -> list[LaneRead]:
        """The demand reads of `experts`' slices of each registered tensor ids[j]: the same groups, reads and
        order as submit_groups given each tensor's (pos0 + e * nb2, nb2, addr0 + e * nb2) in turn; untagged."""
        n, m = len(ids), len(experts)
        with self._layer_lock:
            if n + m > len(self._ints):
                self._scratch(2 * (n + m))
            ints = self._ints
            ints[:n] = ids
            ints[n:n + m] = experts
            at = self._ints_at
            ok = self.q.bmoe_lanes_submit_layer(self.handle, n, at, m, at + _INT * n, self._outs_at, 0)
            gs = self._outs[:n]
        try:
            if ok <= 0:
                raise RuntimeError("submit after close" if ok == 0 else f"tensor ids {list(ids)}: not all registered")
            err = self._reg_error_of
            return [LaneRead(self, g, None, err[t]) for g, t in zip(gs, ids, strict=True)]
        finally:  # the futures first: on a busy machine the lane woken may take this thread's CPU (caches cold)
            self.q.bmoe_lanes_wake(self.handle)

    def submit1(self, file: int, pos: int, length: int, addr: int, tag: int | None, error_of: ErrorOf,
                speculative: bool = False) -> LaneRead:
        g = self.q.bmoe_lanes_submit1(self.handle, file, pos, length, addr, int(speculative))
        if not g:
            raise RuntimeError("submit after close")
        return LaneRead(self, g, None if tag is None else (tag,), error_of)

    # -- for tests: jobs that hold a lane until released -----------------------------------------------------
    def submit_hold(self, hold_id: int, speculative: bool = False) -> LaneRead:
        g = self.lib.bmoe_lanes_submit_hold(self.handle, hold_id, int(speculative))
        return LaneRead(self, g, None, lambda *a: RuntimeError("hold failed"))

    def release_hold(self, hold_id: int) -> None:
        self.lib.bmoe_lanes_release_hold(self.handle, hold_id)

    def holding(self) -> tuple[int, int, int]:
        """(lanes holding now, most at once, speculative reads queued)."""
        out = (_int * 3)()
        self.lib.bmoe_lanes_holding(self.handle, out)
        return out[0], out[1], out[2]

    @property
    def pooled(self) -> bool:
        """The library has the page pool of --recycle-pages (clanes_pool.c)."""
        return self.lib.bmoe_lanes_version() >= POOL_VERSION

    def set_pool(self, handle: int) -> None:
        """Each read into a region of the pool `handle` (harness.engine.io.recycle.CPagePool) attaches a chunk first."""
        self.lib.bmoe_lanes_set_pool(self.handle, handle)

    def tids(self) -> list[int]:
        """The lanes' thread ids (0: a lane not started yet); [] from a library without them."""
        if not self.pooled:
            return []
        out = (_int * 64)()
        n = self.lib.bmoe_lanes_tids(self.handle, out)
        return list(out[:n])

    def direct(self, file: int) -> bool:
        return bool(self.q.bmoe_lanes_direct(self.handle, file))

    def promote(self, fut: object) -> None:
        if isinstance(fut, LaneRead):
            fut._promote()

    def withdraw(self, futs: list) -> bool:
        """Cancel queued speculative reads all together, or none (as PriorityLanes.withdraw)."""
        if not all(isinstance(f, LaneRead) for f in futs):
            return False
        locks = [f._lock for f in futs]
        for lk in locks:
            lk.acquire()
        try:
            if any(f._settled() for f in futs):
                return False
            gs = (_vp * max(1, len(futs)))(*[f._g for f in futs])
            if not self.q.bmoe_lanes_withdraw(self.handle, len(futs), gs):
                return False
            for f in futs:
                self.q.bmoe_lanes_release(self.handle, f._g)
                f._g = 0
                f._cancelled = True
            return True
        finally:
            for lk in locks:
                lk.release()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.lib.bmoe_lanes_close(self.handle)
