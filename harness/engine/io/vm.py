"""Anonymous reservations that stand in for expert tensors, and page-exact eviction.

Each streamed tensor gets a MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE reservation of its full size plus
padding. The tensor's data pointer is placed so that its address is congruent to the tensor's file
offset modulo the page size: a page-aligned O_DIRECT read of a slice's superset then lands straight in
place (the neighbouring bytes read are the file's own, hence correct). One page of padding before and
after absorbs the superset of the first and last slice.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import sys

PAGE = mmap.PAGESIZE
# Python 3.11's mmap module has no MAP_NORESERVE (3.12 added it): Linux's value on the architectures this runs on, so
# the reservations are what the docstring says (not counted against the commit limit, and `nr` in smaps)
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") and platform.machine() in
                        ("x86_64", "aarch64", "armv7l", "armv8l", "i686") else 0)
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


class Reservation:
    def __init__(self, size: int, file_offset: int):
        self.size = size
        self.total = size + 3 * PAGE
        flags = mmap.MAP_PRIVATE | MAP_NORESERVE
        self.mm = mmap.mmap(-1, self.total, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.mm))
        self.data = self.base + PAGE + (file_offset % PAGE)
        self.file_offset = file_offset

    def addr_of(self, file_pos: int) -> int:
        """Address that holds the byte at absolute file position `file_pos`."""
        return self.data + (file_pos - self.file_offset)

    def pages(self, file_start: int, file_end: int) -> tuple[int, int] | None:
        """(address, length) of the pages wholly inside [file_start, file_end), or None. A boundary page shared
        with a neighbouring slice is left out, since the neighbour may be resident."""
        a_pg = (self.addr_of(file_start) + PAGE - 1) // PAGE * PAGE
        b_pg = self.addr_of(file_end) // PAGE * PAGE
        return (a_pg, b_pg - a_pg) if b_pg > a_pg else None

    def release(self, file_start: int, file_end: int) -> int:
        """Release the pages wholly inside [file_start, file_end) (`pages`). Returns bytes released."""
        pg = self.pages(file_start, file_end)
        if pg is None:
            return 0
        a_pg, n = pg
        b_pg = a_pg + n
        # through ctypes, which lets go of the GIL while the kernel frees the pages (mmap.madvise holds it: a release
        # on the releaser thread then stalled the compute thread's next callback; a 3 s side test here saw 62-81
        # gaps over 1 ms in a sleeping thread's wake-ups with mmap.madvise, 3-32 with this call)
        if _libc.madvise(a_pg, b_pg - a_pg, mmap.MADV_DONTNEED) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"madvise(MADV_DONTNEED) of {b_pg - a_pg} bytes: {os.strerror(e)}")
        return b_pg - a_pg


class SharedSlot:
    """One anonymous buffer that every layer's tensor of one kind (gate, up, down) is placed in when there is
    no expert cache: a layer's matmuls finish before the next layer's reads are issued, so the routed slices
    of one layer at a time are all it must hold. Its pages are faulted once and reused every token (no
    zeroing, no release), as the C++ original's shared slots. `view` places one tensor in it."""

    def __init__(self, size: int):
        self.res = Reservation(size, 0)

    def view(self, size: int, file_offset: int) -> Reservation:
        if size + file_offset % PAGE > self.res.size + PAGE:
            raise ValueError(f"a tensor of {size} bytes does not fit the shared slot of {self.res.size}")
        v = object.__new__(Reservation)
        v.size, v.total, v.mm, v.base = size, self.res.total, self.res.mm, self.res.base
        v.data = self.res.base + PAGE + (file_offset % PAGE)
        v.file_offset = file_offset
        return v
