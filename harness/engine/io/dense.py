"""Where the dense weights live during a run (`--dense-weights mmap|warm|anon`), and how much of them is
resident.

Dense = every tensor that is not a streamed routed expert (attention, norms, router, embeddings, biases,
shared experts): the bytes every token reads. Under memory pressure the kernel reclaims them from the page
cache like any other file page, and each token then faults them back in.

- `mmap`: llama.cpp's file mapping as loaded (its own behaviour).
- `warm`: the same mapping; after load the dense ranges are read once, sequentially (pread, merged ranges,
  in file order), so they start out in the page cache. Pressure can still evict them later.
- `anon`: every dense tensor is read at load (O_DIRECT where the filesystem allows, buffered otherwise)
  into its own anonymous reservation. The eval callback rebinds the tensor's data pointer to it the first
  time the tensor is a source of a graph node, in the ask phase, before anything computes (the hook); the
  tensor's whole pages in llama.cpp's mapping are then dropped (MADV_DONTNEED) and its file range leaves
  the page cache (POSIX_FADV_DONTNEED). The mapping itself stays mapped, so a view made from a weight
  before the rebind still reads the right bytes. Anonymous pages are never reclaimed as file pages:
  without swap they stay resident whatever the page cache does. Tensors the graph never reads are freed
  after the first decode. Works with and without `--moe-stream` (without it the hook is installed only to
  rebind the dense weights; the routed experts stay in the mapping, as in the plain run).

`resident_frac()` is the per-token `dense_resident_frac` column (every `sample_every` tokens, -1 in
between): mincore(2) over the dense ranges (whole pages overlapping a dense tensor) of llama.cpp's file
mapping, found in /proc/self/maps, for mmap and warm (a page in the page cache counts as resident:
touching it is at most a minor fault); for anon, mincore over the bound tensors' anonymous reservations
(1.0 unless they were swapped out).
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from harness.engine.io.vm import PAGE, Reservation
from harness.engine.model.gguf_layout import DenseTensor, ModelLayout

if TYPE_CHECKING:
    from harness.engine.io.reader import ExpertReader, SliceReader

    ReaderWrapper = Callable[[SliceReader, ModelLayout], ExpertReader]

MODES = ("mmap", "warm", "anon")  # --dense-weights; "auto" resolves to one of them
SWEEP_CHUNK = 4 << 20
# mincore costs ~65 ns a page (2.3 ms for the 35,600 dense pages of a 150 MB model, 0.07 ms for a 4 MB one):
# one measurement per this many pages' worth of tokens keeps it near 0.5 ms per token
PAGES_PER_SAMPLE = 8192

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_libc.mincore.restype = ctypes.c_int


def effective_mode(mode: str, moe_stream: bool) -> str:
    """`auto` is anon for a streamed run (measured: campaigns/dense-weights.yaml) and mmap for the plain run,
    which stays llama.cpp's own behaviour."""
    if mode == "auto":
        return "anon" if moe_stream else "mmap"
    return mode


def sample_every(layout: ModelLayout) -> int:
    """Measure dense_resident_frac every N tokens: 1 up to 32 MiB of dense weights, then one more token per
    32 MiB (the CSV has -1 in between)."""
    return max(1, layout.nonexpert_bytes // PAGE // PAGES_PER_SAMPLE)


def merged_ranges(tensors: Iterable[DenseTensor]) -> dict[Path, list[tuple[int, int]]]:
    """Per file, the dense byte ranges [start, end) in file order, touching or overlapping ones merged."""
    by_file: dict[Path, list[tuple[int, int]]] = {}
    for t in sorted(tensors, key=lambda t: (str(t.path), t.abs_offset)):
        rs = by_file.setdefault(t.path, [])
        end = t.abs_offset + t.nbytes
        if rs and t.abs_offset <= rs[-1][1]:
            rs[-1] = (rs[-1][0], max(rs[-1][1], end))
        else:
            rs.append((t.abs_offset, end))
    return by_file


def page_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The whole pages overlapping each range, merged: [start, end) page-aligned file offsets."""
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        pa, pb = a // PAGE * PAGE, (b + PAGE - 1) // PAGE * PAGE
        if out and pa <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], pb))
        else:
            out.append((pa, pb))
    return out


def warm_sweep(layout: ModelLayout) -> tuple[int, float]:
    """Read every dense range once, sequentially, into the page cache. Returns (bytes read, seconds)."""
    t0 = time.perf_counter()
    buf = bytearray(SWEEP_CHUNK)
    mv = memoryview(buf)
    total = 0
    for path, ranges in merged_ranges(layout.dense.values()).items():
        fd = os.open(path, os.O_RDONLY)
        try:
            for a, b in ranges:
                pos = a
                while pos < b:
                    n = os.preadv(fd, [mv[: min(SWEEP_CHUNK, b - pos)]], pos)
                    if n <= 0:
                        raise OSError(f"short read at {pos} in {path}: the model file is truncated")
                    pos += n
                    total += n
        finally:
            os.close(fd)
    return total, time.perf_counter() - t0


class _Mincore:
    """Resident fraction of a fixed set of page-aligned address spans."""

    def __init__(self, spans: list[tuple[int, int]]):
        self.spans = spans  # (address, length), both page multiples
        self.pages = sum(n for _, n in spans) // PAGE
        self.vec = (ctypes.c_ubyte * max(1, max((n // PAGE for _, n in spans), default=1)))()
        self.view = np.frombuffer(self.vec, dtype=np.uint8)

    def frac(self) -> float:
        if not self.pages:
            return -1.0
        resident = 0
        for addr, n in self.spans:
            if _libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(n), self.vec) != 0:
                return -1.0
            resident += int(np.count_nonzero(self.view[: n // PAGE] & 1))
        return resident / self.pages


def _file_mappings(path: Path) -> list[tuple[int, int, int]]:
    """(start, end, file offset) of every mapping of `path` in this process (/proc/self/maps)."""
    want = os.path.realpath(path)
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].rstrip("\n") == want:
                a, b = (int(x, 16) for x in parts[0].split("-"))
                out.append((a, b, int(parts[2], 16)))
    return out


def mapping_spans(layout: ModelLayout) -> list[tuple[int, int]]:
    """Address spans of the dense pages inside llama.cpp's file mapping(s) of the model."""
    spans: list[tuple[int, int]] = []
    for path, ranges in merged_ranges(layout.dense.values()).items():
        maps = _file_mappings(path)
        for fa, fb in page_ranges(ranges):
            for start, end, off in maps:
                lo, hi = max(fa, off), min(fb, off + (end - start))
                if hi > lo:
                    spans.append((start + (lo - off), hi - lo))
    return spans


@dataclass
class _Anon:
    tensor: DenseTensor
    res: Reservation
    old: int = 0  # the address it had in llama.cpp's mapping (0 until bound)


class AnonDense:
    """The dense tensors' anonymous copies, and their rebinding (called by the hook in the ask phase)."""

    def __init__(self, layout: ModelLayout, odirect: bool, lanes: int, wrap: ReaderWrapper | None = None):
        from harness.engine.io.reader import SliceReader

        self.layout = layout
        reader = SliceReader(layout.shards, lanes, odirect)
        self.reader: ExpertReader = wrap(reader, layout) if wrap else reader
        self.copies: dict[str, _Anon] = {}
        self.bound: dict[int, _Anon] = {}  # tensor address -> its copy
        self.read_bytes = 0
        self.read_s = 0.0
        self.freed = 0  # tensors the graph never read

    def load(self) -> None:
        t0 = time.perf_counter()
        futs = []
        for t in sorted(self.layout.dense.values(), key=lambda t: (str(t.path), t.abs_offset)):
            a = _Anon(t, Reservation(t.nbytes, t.abs_offset))
            self.copies[t.name] = a
            futs.append(self.reader.submit(t.path, t.abs_offset, t.nbytes, a.res.data))
        for f in futs:
            got, _ns = f.result()
            self.read_bytes += got
        self.read_s = time.perf_counter() - t0

    def bind(self, addr: int, name: str, shape: tuple[int, ...], ggml_type: int, data: int) -> int:
        """The address of the anonymous copy the model tensor at `addr` (named `name`, data now at `data`)
        is to point at, its old pages released; 0 for a tensor that is not a dense weight. Raises on a
        shape or type mismatch."""
        a = self.copies.get(name)
        if a is None:
            return 0
        t = a.tensor
        n = len(t.shape)
        same = shape[:n] == t.shape and all(d == 1 for d in shape[n:])
        # a loader reshape (TENSOR_ALLOW_RESHAPE, e.g. deepseek4's attn_output_a {a, b*c} -> {a, b, c}) keeps the
        # bytes: same rows, same element count
        reshaped = shape[0] == t.shape[0] and int(np.prod(shape)) == int(np.prod(t.shape))
        if not (same or reshaped) or ggml_type != t.ggml_type:
            raise ValueError(f"{name}: graph tensor shape {shape} type {ggml_type} does not match the GGUF "
                             f"({t.shape}, {t.ggml_type}); was the model loaded with weight repacking?")
        self.bound[addr] = a
        if data and data != a.res.data:
            a.old = data
            self.reader.release_mapped(t.path, t.abs_offset, t.nbytes, data)
        return a.res.data

    def rebound_view(self, view_src: int, view_offs: int, data: int) -> int | None:
        """The new address of a view of a rebound weight still pointing into the old mapping, else None."""
        a = self.bound.get(view_src)
        if a is None or not a.old or data != a.old + view_offs:
            return None
        return a.res.data + view_offs

    def finish(self) -> None:
        """After the graphs have been built: free the copies of tensors the graph never read."""
        used = {id(a) for a in self.bound.values()}
        for name in [n for n, a in self.copies.items() if id(a) not in used]:
            self.copies.pop(name).res.mm.close()
            self.freed += 1
        self.reader.close()

    @property
    def bound_names(self) -> set[str]:
        return {a.tensor.name for a in self.bound.values()}

    def spans(self) -> list[tuple[int, int]]:
        out = []
        for a in {id(a): a for a in self.bound.values()}.values():
            lo = a.res.data // PAGE * PAGE
            hi = (a.res.data + a.tensor.nbytes + PAGE - 1) // PAGE * PAGE
            out.append((lo, hi - lo))
        return out


class DenseWeights:
    """The run's dense-weight policy: what happens at load, the anonymous copies for the hook (anon only),
    and the per-token resident fraction (sampled every `sample_every` tokens, -1 in between)."""

    def __init__(self, mode: str, layout: ModelLayout, *, odirect: bool = True, lanes: int = 4,
                 sample_every: int = 1, wrap_reader: ReaderWrapper | None = None):
        if mode not in MODES:
            raise ValueError(f"dense-weights mode {mode!r}")
        self.mode = mode
        self.layout = layout
        self.odirect = odirect
        self.lanes = lanes
        self.sample_every = max(1, sample_every)
        self.wrap_reader = wrap_reader  # tests only (harness.engine.io.faults)
        self.anon: AnonDense | None = None
        self.sweep_bytes = 0
        self.load_s = 0.0
        self._probe: _Mincore | None = None

    def after_load(self) -> None:
        """Called once the model is loaded, before the context is made."""
        if self.mode == "warm":
            self.sweep_bytes, self.load_s = warm_sweep(self.layout)
        elif self.mode == "anon":
            self.anon = AnonDense(self.layout, self.odirect, self.lanes, self.wrap_reader)
            self.anon.load()
            self.load_s = self.anon.read_s

    def resident_frac(self, step: int) -> float:
        if (step - 1) % self.sample_every:
            return -1.0
        if self._probe is None:
            if self.anon is not None:
                if not self.anon.bound:
                    return -1.0
                self._probe = _Mincore(self.anon.spans())
            else:
                self._probe = _Mincore(mapping_spans(self.layout))
        return self._probe.frac()

    def note(self) -> str | None:
        """A stderr line for warm and anon (mmap is llama.cpp's own behaviour: nothing to say)."""
        lay = self.layout
        mib = lay.nonexpert_bytes / 1048576
        if self.mode == "warm":
            return f"bmoe: dense weights warm: {self.sweep_bytes / 1048576:.1f} MiB swept in {self.load_s:.2f} s"
        if self.mode == "anon" and self.anon is not None:
            how = "O_DIRECT" if self.anon.reader.odirect else "buffered"
            return (f"bmoe: dense weights anon: {len(lay.dense)} tensors, {mib:.1f} MiB read ({how}) into "
                    f"anonymous memory in {self.load_s:.2f} s")
        return None

    def summary(self) -> dict[str, object]:
        d: dict[str, object] = {"dense_load_s": round(self.load_s, 3)}
        if self.anon is not None:
            d["dense_bound_tensors"] = len(self.anon.bound_names)
            d["dense_unused_tensors"] = self.anon.freed
        return d

    def close(self) -> None:
        if self.anon is not None:
            self.anon.reader.close()  # idempotent (finish() may have closed it)
