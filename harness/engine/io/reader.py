"""Positioned slice reads into place, on parallel lanes, with O_DIRECT and a buffered fallback.

`os.preadv` releases the GIL, so lanes (threads) overlap reads. With O_DIRECT the page-aligned superset
of a slice is read straight into the reservation (addresses are congruent to file offsets, see vm.py).
Where the filesystem refuses O_DIRECT (tmpfs, some overlays) the reader says so once and reads buffered;
the bytes that land are identical either way.

The lanes have two priorities (harness.engine.io.lanes): demand reads (`submit`) always go first; speculative
ones (`submit_speculative`, prefetch) run only on lanes with no demand work, at most `spec_max` at a time;
`promote` moves a queued speculative read ahead when a demand read needs its bytes. `submit_many` hands one
tensor's missed slices over in one call; `register` + `submit_registered` a layer's tensors' misses given only the
expert ids (the hook's path without --io-trace). The lanes are the compiled ones (harness.engine.io.clanes: no GIL
on the lanes) when built, else the Python ones (BMOE_PURE_PYTHON_LANES=1 forces them); the bytes are the same.
"""

from __future__ import annotations

import ctypes
import errno
import os
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Protocol

from harness.engine.io import clanes
from harness.engine.io.lanes import PriorityLanes
from harness.engine.io.read_group import Gather, chunks
from harness.engine.io.recycle import PagePool, make_pool
from harness.engine.io.vm import PAGE

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MADV_DONTNEED = 4


def _buf(addr: int, n: int) -> memoryview:
    return memoryview((ctypes.c_char * n).from_address(addr)).cast("B")


Read = tuple[int, int, int, int | None]  # (file_pos, length, addr, io-trace tag or None) of one slice


class ExpertReader(Protocol):
    """Everything the hook, the prefetcher, the dense weights and the engine's preamble ask of a reader
    (SliceReader; the fault-injecting wrapper faults.FaultyReader). Each submit returns a Future whose result()
    is (bytes read, ns spent reading), summed over its reads for the grouped ones."""

    @property
    def odirect(self) -> bool: ...

    @property
    def odirect_refused(self) -> str | None: ...

    @property
    def lanes_impl(self) -> str:
        """Which lanes read: "c" (compiled, harness.engine.io.clanes) or "python" (the CSV's io_lanes)."""
        ...

    def submit(self, path: Path, file_pos: int, length: int, addr: int, tag: int | None = None) -> Future: ...

    def submit_many(self, path: Path, reads: list[Read]) -> Future:
        """Reads of one file as one handle."""
        ...

    def submit_layer(self, tensors: list[tuple[Path, list[Read]]]) -> list[Future]:
        """submit_many for each (path, reads) of a layer's tensors, in one call: one Future per tensor."""
        ...

    def register(self, path: Path, pos0: int, nb2: int, addr0: int) -> int:
        """A tensor whose expert e's slice is nb2 bytes at pos0 + e * nb2 of `path` and lands at addr0 + e * nb2:
        its id for submit_registered."""
        ...

    def submit_registered(self, ids: list[int], experts: list[int]) -> list[Future]:
        """submit_layer of `experts`' slices of each registered tensor ids[j] (untagged): one Future per tensor."""
        ...

    def submit_speculative(self, path: Path, file_pos: int, length: int, addr: int,
                           tag: int | None = None) -> Future: ...

    def promote(self, fut: Future) -> None: ...

    def withdraw(self, futs: list[Future]) -> bool: ...

    def release_mapped(self, path: Path, file_pos: int, length: int, mapped_addr: int) -> None: ...

    def lane_tids(self) -> list[int]:
        """The read lanes' thread ids."""
        ...

    def close(self) -> None: ...


class ReadRecorder(Protocol):
    """What a reader tells about a tagged read (harness.engine.io.tracing.IoTrace)."""

    def read_done(self, rid: int, started_ns: int, finished_ns: int, nbytes: int, lane: int | None = None) -> None: ...


def read_error(e: OSError, path: Path, pos: int, length: int) -> OSError:
    """An expert read the kernel failed (EIO from failing flash, or any other errno): one line naming the file,
    the offset and what to do; never a fallback that would change the output."""
    what = e.strerror or str(e)
    hint = "the storage under it reported a failed read (check dmesg); copy the model elsewhere or replace it" \
        if e.errno == errno.EIO else "the read of an expert slice failed"
    return OSError(e.errno, f"{what} reading {length} bytes at offset {pos} of {path}: {hint}")


def default_spec_max(lanes: int) -> int:
    """Speculative reads in flight at most: every lane but one (one lane always free for demand), at least 1."""
    return max(1, lanes - 1)


class SliceReader:
    def __init__(self, paths: list[Path], lanes: int, odirect: bool, spec_max: int | None = None):
        self.lanes = lanes
        self.fd_buf: dict[Path, int] = {}
        self.fd_direct: dict[Path, int] = {}
        self.odirect_requested = odirect
        self.odirect_refused: str | None = None
        for p in paths:
            self.fd_buf[p] = os.open(p, os.O_RDONLY)
            self.file_size = os.fstat(self.fd_buf[p]).st_size
            if odirect and self.odirect_refused is None:
                try:
                    self.fd_direct[p] = os.open(p, os.O_RDONLY | os.O_DIRECT)
                except OSError as e:
                    self.odirect_refused = f"O_DIRECT refused on {p} ({e.strerror}); reading buffered"
        if self.odirect_refused:
            for fd in self.fd_direct.values():
                os.close(fd)
            self.fd_direct.clear()
        self.sizes = {p: os.fstat(fd).st_size for p, fd in self.fd_buf.items()}
        self.recorder: ReadRecorder | None = None  # --io-trace: told each tagged read's times on its lane
        self._reg: list[tuple[Path, int, int, int]] = []  # registered tensors (register): path, pos0, nb2, addr0
        self.page_pool: PagePool | None = None  # --recycle-pages (recycle): the page pool the reads attach chunks of
        self._py_pool: PagePool | None = None  # the same, when the Python lanes read (their _read attaches)
        lib = clanes.load()
        self.lanes_impl = "c" if lib is not None else "python"
        self._c: clanes.CLanes | None = None
        if lib is None:
            self.pool = PriorityLanes(lanes, spec_max or default_spec_max(lanes), prefix="bmoe-io")
            return
        self._files = list(self.fd_buf)
        self._file_no = {p: i for i, p in enumerate(self._files)}
        self._all_direct = list(self.fd_direct.values())
        self._c = clanes.CLanes(lib, lanes, spec_max or default_spec_max(lanes),
                                [(self.fd_buf[p], self.fd_direct.get(p, -1), self.sizes[p]) for p in self._files],
                                self._fellback)
        self._c.on_done = self._c_done
        self._error_of = {p: self._error_maker(p) for p in self._files}
        if self._c.layer:  # C computes each read (one Python call less per layer on the hook's thread)
            self.submit_registered = self._c.submit_layer  # type: ignore[method-assign,assignment]

    # -- the compiled lanes (harness.engine.io.clanes) ---------------------------------------------------------
    @staticmethod
    def _error_maker(path: Path) -> clanes.ErrorOf:
        def error_of(err: int, pos: int, length: int) -> BaseException:
            if err == clanes.ERR_SHORT:
                return OSError(f"short read at {pos} in {path}: the model file is truncated")
            return read_error(OSError(err, os.strerror(err)), path, pos, length)
        return error_of

    def _fellback(self) -> None:
        assert self._c is not None
        for p in list(self.fd_direct):
            if not self._c.direct(self._file_no[p]):
                self.fd_direct.pop(p)
                self.odirect_refused = f"O_DIRECT read failed on {p} (Invalid argument); reading buffered"

    def _c_done(self, tag: int, t0: int, t1: int, nbytes: int, lane: int) -> None:
        if self.recorder is not None:
            self.recorder.read_done(tag, t0, t1, nbytes, lane)

    def _c_submit(self, path: Path, file_pos: int, length: int, addr: int, tag: int | None,
                  speculative: bool = False) -> Future:
        assert self._c is not None
        return self._c.submit1(self._file_no[path], file_pos, length, addr, None if self.recorder is None else tag,
                               self._error_of[path], speculative)  # type: ignore[return-value]

    @property
    def odirect(self) -> bool:
        return bool(self.fd_direct)

    def recycle(self, kind: str, cap: int) -> PagePool:
        """--recycle-pages KIND: a page pool of at most `cap` bytes (harness.engine.io.recycle) that the lanes take a
        slice's pages from before each read into a registered region; the hook registers the expert tensors'
        reservations with it and their release gives the pages back."""
        if self._c is not None:
            if not self._c.pooled:
                raise OSError("the compiled read lanes predate the page pool; rebuild them "
                              "(python setup.py build_ext --inplace) or set BMOE_PURE_PYTHON_LANES=1")
            pool = make_pool(kind, cap, self._c.lib)
            self._c.set_pool(pool.handle)  # type: ignore[attr-defined]
        else:
            pool = self._py_pool = make_pool(kind, cap, None)
        self.page_pool = pool
        return pool

    def lane_tids(self) -> list[int]:
        """The read lanes' thread ids (their CPU time: sysstats.thread_cpu)."""
        if self._c is not None:
            return [t for t in self._c.tids() if t]
        return [t.native_id for t in self.pool._threads if t.native_id is not None]

    def _read(self, path: Path, file_pos: int, length: int, addr: int) -> tuple[int, int]:
        t0 = time.perf_counter_ns()
        if self._py_pool is not None:  # --recycle-pages: the slice's whole pages become a pool chunk first
            try:
                self._py_pool.attach(addr, length)  # type: ignore[attr-defined]
            except OSError as e:
                raise read_error(e, path, file_pos, length) from None
        fd = self.fd_direct.get(path)
        if fd is not None:
            a = file_pos // PAGE * PAGE
            b = min((file_pos + length + PAGE - 1) // PAGE * PAGE, (self.sizes[path] + PAGE - 1) // PAGE * PAGE)
            dest = addr - (file_pos - a)
            need = file_pos + length - a
            got = 0
            while got < need:
                try:
                    n = os.preadv(fd, [_buf(dest + got, b - a - got)], a + got)
                except OSError as e:  # EINVAL from a filesystem that accepted the open: read buffered
                    if got or e.errno != errno.EINVAL:
                        raise read_error(e, path, a + got, b - a - got) from None
                    self.odirect_refused = f"O_DIRECT read failed on {path} ({e.strerror}); reading buffered"
                    self.fd_direct.pop(path, None)
                    return self._read(path, file_pos, length, addr)
                if n <= 0:
                    raise OSError(f"short read at {a + got} in {path}: the model file is truncated")
                got += n
        else:
            fd = self.fd_buf[path]
            got = 0
            while got < length:
                try:
                    n = os.preadv(fd, [_buf(addr + got, length - got)], file_pos + got)
                except OSError as e:
                    raise read_error(e, path, file_pos + got, length - got) from None
                if n <= 0:
                    raise OSError(f"short read at {file_pos + got} in {path}: the model file is truncated")
                got += n
        return got, time.perf_counter_ns() - t0

    def release_mapped(self, path: Path, file_pos: int, length: int, mapped_addr: int) -> None:
        """After a tensor is rebound, its pages in llama.cpp's file mapping are never used again: unmap
        them from this process (whole pages only) and drop them from the page cache, so memory and the
        reads that follow are what streaming needs, not what the loader's MAP_POPULATE left behind."""
        a = (mapped_addr + PAGE - 1) // PAGE * PAGE
        b = (mapped_addr + length) // PAGE * PAGE
        if b > a:
            _libc.madvise(ctypes.c_void_p(a), ctypes.c_size_t(b - a), _MADV_DONTNEED)
        try:
            os.posix_fadvise(self.fd_buf[path], file_pos, length, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass  # advisory only

    def drop_cached_pages(self) -> None:
        """Drop the files' pages from the page cache (fadvise DONTNEED on every buffered descriptor): buffered reads
        then come from the storage again (the storage probe's, when O_DIRECT was refused)."""
        for fd in self.fd_buf.values():
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def submit(self, path: Path, file_pos: int, length: int, addr: int, tag: int | None = None) -> Future:
        """`tag`: the recorder's id for this read (--io-trace), or None."""
        if self._c is not None:
            return self._c_submit(path, file_pos, length, addr, tag)
        if tag is None or self.recorder is None:
            return self.pool.submit(self._read, path, file_pos, length, addr)
        return self.pool.submit(self._traced_read, tag, path, file_pos, length, addr)

    def submit_many(self, path: Path, reads: list[Read]) -> Future:
        """One tensor's slices (file_pos, length, addr, tag) in one call: one group on the compiled lanes, else
        one Python job per lane (each reading its run of slices in order)."""
        if self._c is not None:
            flat = [x for r in reads for x in r[:3]]
            tags = None if self.recorder is None else [r[3] for r in reads]
            return self._c.submit(self._file_no[path], flat, tags, self._error_of[path])  # type: ignore[return-value]
        return Gather([self.pool.submit(self._read_run, path, run) for run in chunks(reads, self.lanes)])  # type: ignore

    def submit_layer(self, tensors: list[tuple[Path, list[Read]]]) -> list[Future]:
        """submit_many for each (path, reads) of a layer's tensors: on the compiled lanes one call for all (one
        lock, one wake: a layer's 3 tensors were 3 calls), one Future per tensor either way."""
        if self._c is None or len(tensors) < 2:
            return [self.submit_many(path, reads) for path, reads in tensors]
        traced = self.recorder is not None
        flat = [x for _, reads in tensors for r in reads for x in r[:3]]
        return self._c.submit_groups([self._file_no[p] for p, _ in tensors], [len(r) for _, r in tensors], flat,
                                     [[r[3] for r in reads] if traced else None for _, reads in tensors],
                                     [self._error_of[p] for p, _ in tensors])  # type: ignore[return-value]

    def register(self, path: Path, pos0: int, nb2: int, addr0: int) -> int:
        """A tensor of `path` whose expert e's slice is nb2 bytes at pos0 + e * nb2 and lands at addr0 + e * nb2:
        its id for submit_registered (on the compiled lanes, registered with them too)."""
        if self._c is not None and self._c.layer:
            tid = self._c.register(self._file_no[path], pos0, nb2, addr0, self._error_of[path])
            assert tid == len(self._reg)
        self._reg.append((path, pos0, nb2, addr0))
        return len(self._reg) - 1

    def submit_registered(self, ids: list[int], experts: list[int]) -> list[Future]:
        """submit_layer of `experts`' slices of each registered tensor ids[j] (untagged), one Future per tensor.
        On the compiled lanes this is clanes.CLanes.submit_layer (set in __init__): one call, C computes each read."""
        reg = self._reg
        return self.submit_layer([(path, [(pos0 + e * nb2, nb2, addr0 + e * nb2, None) for e in experts])
                                  for path, pos0, nb2, addr0 in [reg[t] for t in ids]])

    def _read_run(self, path: Path, run: list[Read]) -> tuple[int, int]:
        got = ns = 0
        for pos, length, addr, tag in run:
            g, n = (self._read(path, pos, length, addr) if tag is None or self.recorder is None else
                    self._traced_read(tag, path, pos, length, addr))
            got += g
            ns += n
        return got, ns

    def _traced_read(self, tag: int, path: Path, file_pos: int, length: int, addr: int) -> tuple[int, int]:
        t0 = time.perf_counter_ns()
        got, ns = self._read(path, file_pos, length, addr)
        assert self.recorder is not None
        self.recorder.read_done(tag, t0, time.perf_counter_ns(), got)
        return got, ns

    def submit_speculative(self, path: Path, file_pos: int, length: int, addr: int,
                           tag: int | None = None) -> Future:
        """A read ahead (harness.engine.io.lanes: only on a lane no demand read wants); `tag` as for submit."""
        if self._c is not None:
            return self._c_submit(path, file_pos, length, addr, tag, speculative=True)
        if tag is None or self.recorder is None:
            return self.pool.submit(self._read, path, file_pos, length, addr, speculative=True)
        return self.pool.submit(self._traced_read, tag, path, file_pos, length, addr, speculative=True)

    def promote(self, fut: Future) -> None:
        (self._c or self.pool).promote(fut)

    def withdraw(self, futs: list[Future]) -> bool:
        """Cancel speculative reads not yet started, all or none (harness.engine.io.lanes)."""
        return (self._c or self.pool).withdraw(futs)

    def close(self) -> None:
        if self._c is not None:
            if self._c._closed:
                return
            self._c.close()
            self.fd_direct = dict(enumerate(self._all_direct))  # type: ignore[arg-type]  # closed below
        else:
            self.pool.close()
        if self.page_pool is not None:  # after the lanes: none reads into it any more
            self.page_pool.close()
        for fd in list(self.fd_buf.values()) + list(self.fd_direct.values()):
            os.close(fd)
        self.fd_buf.clear()
        self.fd_direct.clear()
