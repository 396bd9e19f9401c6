"""The move kind of the page pool (`--recycle-pages move`) for the Python lanes; the compiled twin is clanes_move.c,
which says how it works: an evicted slice's whole pages stay where they are on a list of free ranges (the page
releaser: no system call), and a lane moves them into a miss's whole pages with UFFDIO_MOVE before its read (a
page-table move: no zeroing, no charge, no new mapping); a miss that is itself on the list takes its pages back in
place. The reservations are registered with a userfaultfd in write-protect mode (which UFFDIO_MOVE needs of its
destination and which traps nothing). The list holds at most `cap` bytes in at most `max_attached` ranges."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import struct
import threading

from harness.engine.io.pages import dontneed, whole_pages

PAGE = mmap.PAGESIZE
_STATS = ("pool_recycled", "pool_fresh", "pool_fallback", "pool_detached", "pool_dontneed", "pool_errors")
_SYS_USERFAULTFD = {"x86_64": 323, "aarch64": 282}.get(os.uname().machine)
_UFFD_API = 0xAA
_FEATURE_MOVE = 1 << 16
_USER_MODE_ONLY = 1
_MODE_WP = 2
_ALLOW_SRC_HOLES = 2


def _iowr(nr: int, size: int) -> int:
    return (3 << 30) | (size << 16) | (0xAA << 8) | nr


_UFFDIO_API, _UFFDIO_REGISTER, _UFFDIO_MOVE = _iowr(0x3F, 24), _iowr(0x00, 32), _iowr(0x05, 40)
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MADV_DONTNEED = 4


def open_uffd() -> int:
    """A userfaultfd with UFFDIO_MOVE; OSError when this kernel or this process has none."""
    if _SYS_USERFAULTFD is None:
        raise OSError(errno.ENOSYS, f"userfaultfd: unknown system call number on {os.uname().machine}")
    flags = os.O_CLOEXEC | os.O_NONBLOCK
    fd = _libc.syscall(_SYS_USERFAULTFD, flags | _USER_MODE_ONLY)
    if fd < 0 and ctypes.get_errno() == errno.EINVAL:
        fd = _libc.syscall(_SYS_USERFAULTFD, flags)
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"userfaultfd: {os.strerror(e)}")
    api = bytearray(struct.pack("QQQ", _UFFD_API, _FEATURE_MOVE, 0))
    try:
        fcntl.ioctl(fd, _UFFDIO_API, api, True)
    except OSError as e:
        os.close(fd)
        raise OSError(e.errno, f"userfaultfd without UFFDIO_MOVE (a kernel older than 6.8?): {e.strerror}") from None
    if not struct.unpack("QQQ", api)[1] & _FEATURE_MOVE:
        os.close(fd)
        raise OSError(errno.ENOTSUP, "userfaultfd without UFFDIO_MOVE (a kernel older than 6.8)")
    return fd


class PyMovePool:
    """See the module docstring; the same calls as harness.engine.io.recycle.PyPagePool."""

    def __init__(self, cap: int, attached_max: int):
        self.uffd = open_uffd()
        self.cap, self.max_attached = cap, attached_max
        self._lock = threading.Condition()
        self._free: dict[int, int] = {}  # first whole page of an evicted slice -> its pages (insertion order: a stack)
        self._busy: set[int] = set()  # ranges whose pages a lane is moving out now
        self._lo: list[int] = []
        self._hi: list[int] = []
        self.free_bytes = 0
        self._st = dict.fromkeys(_STATS, 0)

    def region(self, lo: int, hi: int) -> None:
        n = -(-(hi - lo) // PAGE) * PAGE
        fcntl.ioctl(self.uffd, _UFFDIO_REGISTER, bytearray(struct.pack("QQQQ", lo, n, _MODE_WP, 0)), True)
        with self._lock:
            self._lo.append(lo)
            self._hi.append(hi)

    def _in_region(self, a: int, b: int) -> bool:
        return any(lo <= a and b <= hi for lo, hi in zip(self._lo, self._hi, strict=True))

    def attach(self, addr: int, length: int) -> int:
        a, b = whole_pages(addr, length)
        if b <= a:
            return 0
        pages, done, rc = (b - a) // PAGE, 0, 0
        with self._lock:
            if not self._in_region(a, b):
                return 0
            while a in self._busy:
                self._lock.wait()
            own = self._free.pop(a, None)
            if own is not None:  # its own pages, still here
                self.free_bytes -= own * PAGE
                self._st["pool_recycled"] += 1
                return 1
        while done < pages:
            with self._lock:
                if not self._free:
                    break
                sa, sn = self._free.popitem()
                self.free_bytes -= sn * PAGE
                self._busy.add(sa)
            n = min(sn, pages - done)
            moved, err = self._move(a + done * PAGE, sa, n * PAGE)
            if moved < sn * PAGE:
                _libc.madvise(sa + moved, sn * PAGE - moved, _MADV_DONTNEED)
            with self._lock:
                self._busy.discard(sa)
                self._lock.notify_all()
                if moved:
                    rc = 1
                if err:
                    self._st["pool_errors"] += err != errno.EEXIST
                    break
            done += n
        with self._lock:
            self._st["pool_recycled" if rc else "pool_fallback"] += 1
        return rc

    def _move(self, dst: int, src: int, n: int) -> tuple[int, int]:
        """(bytes moved, errno or 0)"""
        moved = 0
        for _ in range(100):
            buf = bytearray(struct.pack("QQQQq", dst + moved, src + moved, n - moved, _ALLOW_SRC_HOLES, 0))
            try:
                fcntl.ioctl(self.uffd, _UFFDIO_MOVE, buf, True)
                return n, 0
            except OSError as e:
                got = struct.unpack("QQQQq", buf)[4]
                moved += max(got, 0)
                if e.errno != errno.EAGAIN:
                    return moved, e.errno or errno.EIO
        return moved, 0

    def detach(self, addr: int, n: int) -> int:
        with self._lock:
            if addr not in self._free and self.free_bytes + n <= self.cap and len(self._free) < self.max_attached:
                self._free[addr] = n // PAGE
                self.free_bytes += n // PAGE * PAGE
                self._st["pool_detached"] += 1
                return 1
        try:
            dontneed(addr, n)
        except OSError:
            with self._lock:
                self._st["pool_errors"] += 1
            raise
        with self._lock:
            self._st["pool_dontneed"] += 1
        return 0

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {**self._st, "pool_attached": len(self._free), "pool_bytes": self.free_bytes}

    def close(self) -> None:
        if self.uffd >= 0:
            os.close(self.uffd)
            self.uffd = -1
