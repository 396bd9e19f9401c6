"""Two page-granular helpers shared by the page pools of --recycle-pages (harness.engine.io.recycle, the memfd
pool; harness.engine.io.recycle_move, the UFFDIO_MOVE pool): the whole pages inside a byte range, and freeing a
range's pages the plain way. A module of its own so that neither pool imports the other."""

from __future__ import annotations

import ctypes
import mmap
import os

PAGE = mmap.PAGESIZE
_MADV_DONTNEED = 4
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def whole_pages(addr: int, length: int) -> tuple[int, int]:
    """The whole pages inside [addr, addr + length): (first byte, end), end <= first when there are none."""
    return (addr + PAGE - 1) // PAGE * PAGE, (addr + length) // PAGE * PAGE


def dontneed(addr: int, n: int) -> None:
    """Free the pages of [addr, addr + n) the plain way (madvise MADV_DONTNEED); OSError when it fails."""
    if _libc.madvise(addr, n, _MADV_DONTNEED) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"madvise(MADV_DONTNEED) of {n} bytes: {os.strerror(e)}")
