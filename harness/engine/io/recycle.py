"""Recycled pages (`--recycle-pages memfd|move`): an evicted expert slice's physical pages go to the next miss instead
of being freed with MADV_DONTNEED and faulted (zeroed, charged) again by the next read. Two kinds: `move`
(harness.engine.io.recycle_move, clanes_move.c: the evicted pages stay anonymous where they are and a lane moves them
into the miss with UFFDIO_MOVE) and `memfd`, this module's:

The pages live in one memfd, the pool. Before a lane reads a slice into an expert tensor's reservation (a region
registered by the hook as it binds the tensor), it maps a free chunk of the memfd over the slice's whole pages with
MAP_FIXED | MAP_SHARED | MAP_POPULATE: a page-table change, no zeroing (`attach`). The page releaser, where it would
have released the pages with MADV_DONTNEED, maps anonymous memory back over the slice and returns the chunk to the
pool (`detach`). The tensor's virtual layout never changes (llama.cpp reads each expert at its fixed address), and
the bytes a read lands are the same: a chunk is always read over in full before the slice is computed.

Honest memory: the memfd pool carves chunks up to `cap` bytes, the cache budget plus the pages a decode batch holds
before its evictions are released (`pool_cap`: the sum the memory cgroup check, harness.engine.cache.budget.CapFit,
counts), and never more; at most `max_attached` slices at once (each is two VMAs, kept well under
vm.max_map_count). A slice that finds no chunk is read into plain anonymous pages, as without the pool, and its
release is then MADV_DONTNEED (counted: `pool_fallback`). The pool's pages are shared memory: RssShmem, not RssAnon,
and charged to the memory cgroup as the anonymous pages were.

Two twins, one behaviour: `CPagePool` in the compiled lanes' library (clanes_pool.c; the lanes attach before each
read without the GIL) and `PyPagePool` for the Python lanes (harness.engine.io.reader calls `attach`).
"""

from __future__ import annotations

import bisect
import ctypes
import mmap
import os
import platform
import sys
import threading
from typing import Protocol

from harness.engine.io.pages import dontneed, whole_pages

PAGE = mmap.PAGESIZE  # as harness.engine.io.vm's (which imports this module)

GRANULE = 16  # pages: chunks come in multiples of 64 KiB, so slices of one tensor (n or n-1 whole pages) share sizes
STATS = ("pool_recycled", "pool_fresh", "pool_fallback", "pool_detached", "pool_dontneed", "pool_errors",
         "pool_attached", "pool_bytes")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_PROT_RW = 0x1 | 0x2
_MAP_SHARED, _MAP_PRIVATE, _MAP_FIXED, _MAP_ANONYMOUS = 0x01, 0x02, 0x10, 0x20
_MAP_POPULATE = 0x8000
# how the reservations are mapped (harness.engine.io.vm): MAP_NORESERVE, so they are not counted against the commit
# limit (`nr` in smaps). Python 3.11's mmap module has no MAP_NORESERVE (3.12 added it): Linux's value on the
# architectures this runs on. An anonymous range mapped back over a slice must match, or the VMAs do not merge again
NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") and platform.machine() in
                    ("x86_64", "aarch64", "armv7l", "armv8l", "i686") else 0)
_MAP_FAILED = ctypes.c_void_p(-1).value
_MADV_DONTNEED = 4


class PagePool(Protocol):
    """What the hook and the page releaser use of a pool (both twins)."""

    def region(self, lo: int, hi: int) -> None:
        """An expert tensor's reservation [lo, hi): reads into it attach chunks."""
        ...

    def detach(self, addr: int, n: int) -> int:
        """Instead of MADV_DONTNEED of the whole pages [addr, addr + n) of an evicted slice. Raises OSError."""
        ...

    def stats(self) -> dict[str, int]: ...

    def close(self) -> None: ...


KINDS = ("memfd", "move")


def pool_cap(kind: str, budget: int, release_slack: int) -> int:
    """The most a pool may hold, within what the cgroup fit check counts: the memfd pool holds every recycled slice's
    pages, so the cache budget and the evicted pages a decode batch may hold before they are released
    (harness.engine.cache.budget.release_slack); the move pool holds only evicted pages, so the release batch."""
    return budget + release_slack if kind == "memfd" else release_slack


def recycle_kind(asked: str, budget: int) -> tuple[str, str]:
    """--recycle-pages ASKED with a cache budget of `budget` bytes: (the pool kind to make, or "off"; what took effect
    and why, for the CSV). auto is move with a cache (the quiet run of bench-data/2026-12-04-recycle: 1.26x tok/s),
    off without one (the shared slots reuse their pages already); the composition root turns auto's move off where
    the kernel refuses it, saying so."""
    if asked != "auto":
        return asked, asked
    if not budget:
        return "off", "off (auto: no expert cache; the shared slots reuse their pages already)"
    return "move", "move (auto)"


def make_pool(kind: str, cap: int, lib: ctypes.CDLL | None) -> PagePool:
    """A pool of `kind` holding at most `cap` bytes: in the compiled lanes' library `lib`, else for the Python lanes.
    OSError when this kernel cannot (the move kind needs userfaultfd with UFFDIO_MOVE, Linux 6.8)."""
    if lib is not None:
        return CPagePool(lib, cap, kind=kind)
    if kind == "move":
        from harness.engine.io.recycle_move import PyMovePool

        return PyMovePool(cap, max_attached(cap))
    return PyPagePool(cap)


def max_map_count() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 65530  # the kernel's default


def vma_count() -> int:
    """The process's mappings now (lines of /proc/self/maps), -1 when unreadable."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return -1


def max_attached(cap: int) -> int:
    """Slices attached at once at most: every chunk the cap allows, but at most a quarter of the mappings still
    free under vm.max_map_count (an attached slice splits its reservation: two more VMAs)."""
    free = max_map_count() - max(vma_count(), 0)
    return max(0, min(cap // (GRANULE * PAGE) + 1, free // 4))


def _mmap(addr: int, n: int, flags: int, fd: int = -1, off: int = 0) -> None:
    if _libc.mmap(addr, n, _PROT_RW, flags, fd, off) == _MAP_FAILED:
        e = ctypes.get_errno()
        raise OSError(e, f"mmap of {n} bytes at {addr:#x} for the page pool: {os.strerror(e)}")


def _anon(addr: int, n: int) -> None:
    _mmap(addr, n, _MAP_PRIVATE | _MAP_ANONYMOUS | NORESERVE | _MAP_FIXED)


class PyPagePool:
    """The pool for the Python lanes (see the module docstring); the compiled twin is clanes_pool.c."""

    def __init__(self, cap: int, granule: int = GRANULE, attached_max: int | None = None):
        self.fd = os.memfd_create("bmoe-pool", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, cap)
        self.cap, self.granule = cap, granule
        self.max_attached = max_attached(cap) if attached_max is None else attached_max
        self.carved = 0
        self._lock = threading.Lock()
        self._free: dict[int, list[int]] = {}  # chunk size in granules -> free chunks' memfd offsets
        self._attached: dict[int, tuple[int, int, int]] = {}  # first whole page -> (offset, size class, pages)
        self._lo: list[int] = []
        self._hi: list[int] = []
        self._st = dict.fromkeys(STATS[:6], 0)

    def region(self, lo: int, hi: int) -> None:
        with self._lock:
            i = bisect.bisect_right(self._lo, lo)
            self._lo.insert(i, lo)
            self._hi.insert(i, hi)

    def _in_region(self, a: int, b: int) -> bool:
        i = bisect.bisect_right(self._lo, a)
        return i > 0 and b <= self._hi[i - 1]

    def attach(self, addr: int, length: int) -> int:
        """Before a read of `length` bytes to `addr` (see clanes_pool.c's bmoe_pool_attach: 1 recycled, 2 fresh, 0
        nothing done). Raises OSError when the mapping fails (the range is anonymous again)."""
        a, b = whole_pages(addr, length)
        if b <= a:
            return 0
        pages = (b - a) // PAGE
        cls = -(-pages // self.granule)
        rc = 1
        with self._lock:
            if not self._in_region(a, b) or a in self._attached:
                return 0
            room = len(self._attached) < self.max_attached
            off = self._pop(cls) if room else -1
            if off < 0 and room and (off := self._pop(cls + 1)) >= 0:
                cls += 1
            size = cls * self.granule * PAGE
            if off < 0 and room and self.carved + size <= self.cap:
                off, rc = self.carved, 2
                self.carved += size
            if off < 0:
                self._st["pool_fallback"] += 1
                return 0
            self._attached[a] = (off, cls, pages)
        try:
            _mmap(a, pages * PAGE, _MAP_SHARED | _MAP_FIXED | _MAP_POPULATE, self.fd, off)
        except OSError:
            try:
                _anon(a, pages * PAGE)
            finally:
                with self._lock:
                    del self._attached[a]
                    self._free.setdefault(cls, []).append(off)
                    self._st["pool_errors"] += 1
            raise
        with self._lock:
            self._st["pool_recycled" if rc == 1 else "pool_fresh"] += 1
        return rc

    def _pop(self, cls: int) -> int:
        free = self._free.get(cls)
        return free.pop() if free else -1

    def detach(self, addr: int, n: int) -> int:
        with self._lock:
            s = self._attached.pop(addr, None)
        if s is None:
            try:
                dontneed(addr, n)
            except OSError:
                with self._lock:
                    self._st["pool_errors"] += 1
                raise
            with self._lock:
                self._st["pool_dontneed"] += 1
            return 0
        off, cls, pages = s
        try:
            _anon(addr, pages * PAGE)
        except OSError:
            with self._lock:
                self._st["pool_errors"] += 1  # the chunk stays mapped there: lost to the pool
            raise
        with self._lock:
            self._free.setdefault(cls, []).append(off)
            self._st["pool_detached"] += 1
        return 1

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {**self._st, "pool_attached": len(self._attached), "pool_bytes": self.carved}

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


_i64, _vp = ctypes.c_int64, ctypes.c_void_p


def declare(lib: ctypes.CDLL) -> None:
    """The pool's calls in the compiled lanes' library (version 5)."""
    lib.bmoe_pool_new.restype = _vp
    lib.bmoe_pool_new.argtypes = [_i64, _i64, _i64, ctypes.c_int, ctypes.c_int]
    lib.bmoe_pool_region.restype = ctypes.c_int
    lib.bmoe_pool_region.argtypes = [_vp, ctypes.c_size_t, ctypes.c_size_t]
    lib.bmoe_pool_attach.restype = ctypes.c_int
    lib.bmoe_pool_attach.argtypes = [_vp, ctypes.c_size_t, _i64]
    lib.bmoe_pool_detach.restype = ctypes.c_int
    lib.bmoe_pool_detach.argtypes = [_vp, ctypes.c_size_t, _i64]
    lib.bmoe_pool_stats.argtypes = [_vp, _vp]
    lib.bmoe_pool_free.argtypes = [_vp]


class CPagePool:
    """The pool in the compiled lanes' library (clanes_pool.c): the lanes attach chunks before their reads; `detach`
    runs on the page releaser's thread through ctypes (the GIL released while the kernel changes the mappings)."""

    def __init__(self, lib: ctypes.CDLL, cap: int, granule: int = GRANULE, attached_max: int | None = None,
                 kind: str = "memfd"):
        self.lib = lib
        self.max_attached = max_attached(cap) if attached_max is None else attached_max
        self.handle = lib.bmoe_pool_new(cap, granule, self.max_attached, KINDS.index(kind), int(bool(NORESERVE)))
        if not self.handle:
            why = ("a userfaultfd with UFFDIO_MOVE (Linux 6.8+) could not be opened" if kind == "move" else
                   f"a memfd of {cap} bytes could not be made")
            raise OSError(f"the page pool: {why}; run with another --recycle-pages kind or without it")

    def region(self, lo: int, hi: int) -> None:
        rc = self.lib.bmoe_pool_region(self.handle, lo, hi)
        if rc == -1:
            raise MemoryError("bmoe: the page pool could not register a tensor")
        if rc < 0:
            raise OSError(-rc, f"registering an expert tensor with the page pool's userfaultfd: {os.strerror(-rc)}")

    def attach(self, addr: int, length: int) -> int:
        """As the lanes do before a read (tests)."""
        rc = self.lib.bmoe_pool_attach(self.handle, addr, length)
        if rc < 0:
            raise OSError(-rc, f"mmap of a pool chunk at {addr:#x}: {os.strerror(-rc)}")
        return rc

    def detach(self, addr: int, n: int) -> int:
        rc = self.lib.bmoe_pool_detach(self.handle, addr, n)
        if rc < 0:
            raise OSError(-rc, f"releasing {n} bytes of expert pages at {addr:#x}: {os.strerror(-rc)}")
        return rc

    def stats(self) -> dict[str, int]:
        out = (_i64 * 8)()
        self.lib.bmoe_pool_stats(self.handle, out)
        return dict(zip(STATS, list(out), strict=True))

    def close(self) -> None:
        if self.handle:
            self.lib.bmoe_pool_free(self.handle)
            self.handle = None
