"""Measure how fast the model's storage reads the way the engine reads it, for the report's I/O roofline (local
targets).

The engine's own read lanes (harness.engine's SliceReader: the compiled lanes where built, O_DIRECT where the
filesystem allows it) read what a streamed token reads: for each MoE layer in turn, the whole slices of top-k
distinct random experts of every streamed tensor of that layer, handed over as one batch, with 1, 2 and 4 layers'
batches in flight (the next layers' reads queued while the current one's finish, as read-ahead does); the best of the
three is the figure: the most the lanes get from this storage, an upper bound for a cell's reads, not what one cell
got. The reads land in buffers faulted once before the clock starts (the storage and the lanes are measured, not
the page faults of fresh memory; --recycle-pages is about those). The 1 MiB reads this replaced understated the lanes
by up to 2.7x on this machine (bench-data/2026-12-03-gptoss-local-quiet: cells at 121-273% of that roofline). It is
one moment's figure: on this shared VM the same probe gave 1000-1535 MiB/s on one file within an hour."""

from __future__ import annotations

import ctypes
import mmap
import random
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from harness.campaigns.expand import Cell
from harness.engine import PAGE, SPECS, ModelLayout, SliceReader, load_layout
from harness.errors import UserError

_IO_THREADS = next(s for s in SPECS if s.name == "io_threads")  # the engine's --io-threads, as it declares it
DEFAULT_LANES = _IO_THREADS.default
IO_THREADS_MAX = _IO_THREADS.flag.hi


def _not(why: str) -> dict:
    return {"mib_s": None, "method": f"not measured: {why}"}


DEPTHS = (1, 2, 4)  # layers' batches in flight: one (demand reads alone), then as read-ahead keeps them queued


def probe_read_bandwidth(path: Path, *, lanes: int = DEFAULT_LANES, seconds: float = 2.0, max_mib: int = 1024,
                         depths: Sequence[int] = DEPTHS, seed: int = 0) -> dict:
    """{"mib_s": MiB/s of expert slices read, the best over `depths` (None when not measured), "method": how, in one
    line}. Each depth reads for at most `seconds` or `max_mib`."""
    try:
        lay = load_layout(path)
    except (UserError, OSError, ValueError) as e:
        return _not(str(e))
    k_of = lay.expert_used_by_layer  # each layer's top-k: load_layout checked 1..n_expert where it has experts
    layers = [il for il in lay.moe_layers if lay.by_layer.get(il) and il < len(k_of)]
    if not layers:
        return _not(f"{path}: no streamed expert tensors")
    slot = max(t.nb2 for il in layers for t in lay.by_layer[il]) + 3 * PAGE
    slot = (slot + PAGE - 1) // PAGE * PAGE
    per_batch = max(k_of[il] * len(lay.by_layer[il]) for il in layers)
    buf = mmap.mmap(-1, slot * per_batch * max(depths))
    for off in range(0, len(buf), PAGE):  # fault every page now: the clock measures the reads only
        buf[off] = 1
    view = (ctypes.c_char * len(buf)).from_buffer(buf)  # the buffer's address; released before buf closes
    batch = _Batches(lay, layers, ctypes.addressof(view), slot, per_batch, random.Random(seed))
    try:
        reader = SliceReader(lay.shards, lanes, odirect=True)
    except OSError as e:
        del view, batch
        buf.close()
        return _not(f"{path}: {e.strerror}")
    if reader.odirect_refused:
        reader.drop_cached_pages()
    got: dict[int, tuple[int, float]] = {}
    try:
        for d in depths:
            got[d] = _measure(reader, batch, d, seconds, max_mib << 20)
    except OSError as e:
        return _not(f"{path}: {e}")
    finally:
        reader.close()
        del view, batch
        buf.close()
    rate = {d: n / 2**20 / dt for d, (n, dt) in got.items() if dt > 0 and n > 0}
    if not rate:
        return _not(f"{path}: nothing read")
    best = max(rate, key=lambda d: rate[d])
    k = sorted({k_of[il] for il in layers})
    kb = sum(t.nb2 for il in layers for t in lay.by_layer[il]) / sum(len(lay.by_layer[il]) for il in layers) / 1024
    how = "buffered after fadvise DONTNEED (O_DIRECT refused)" if reader.odirect_refused else "O_DIRECT"
    each = " / ".join(f"{rate[d]:.0f}" for d in depths if d in rate)
    n, dt = got[best]
    method = (f"the engine's read lanes ({reader.lanes_impl}, {lanes} lanes, {how}): each MoE layer's top-"
              f"{'/'.join(map(str, k))} random experts' whole slices (mean {kb:.0f} KiB) as one batch; the best of "
              f"{'/'.join(map(str, depths))} layers in flight ({each} MiB/s): {best}, {n / 2**20:.0f} MiB in "
              f"{dt:.2f} s")
    return {"mib_s": round(rate[best], 1), "method": method}


class _Batches:
    """Layer after layer, each layer's batch: top-k distinct random experts of each of its streamed tensors, each
    slice read into its own slot at an address congruent to its file offset (as O_DIRECT and the engine's
    reservations need); `depth` batches in flight use `depth` disjoint sets of slots."""

    def __init__(self, lay: ModelLayout, layers: list[int], base: int, slot: int, per_batch: int,
                 rng: random.Random):
        self.lay, self.layers, self.base, self.slot, self.per_batch, self.rng = lay, layers, base, slot, per_batch, rng
        self.i = 0

    def submit(self, reader: SliceReader, where: int) -> tuple[list, int]:
        lay, il = self.lay, self.layers[self.i % len(self.layers)]
        self.i += 1
        experts = self.rng.sample(range(lay.n_expert), lay.expert_used_by_layer[il])
        base = self.base + where * self.per_batch * self.slot
        tensors, n, j = [], 0, 0
        for t in lay.by_layer[il]:
            reads = []
            for e in experts:
                pos = t.abs_offset + e * t.nb2
                reads.append((pos, t.nb2, base + j * self.slot + PAGE + pos % PAGE, None))
                n += t.nb2
                j += 1
            tensors.append((t.path, reads))
        return reader.submit_layer(tensors), n


def _measure(reader: SliceReader, batch: _Batches, depth: int, seconds: float, budget: int) -> tuple[int, float]:
    """(bytes read, seconds) with `depth` layers' batches in flight, for at most `seconds` or `budget` bytes."""
    inflight: deque = deque()
    done = asked = k = 0
    t0 = time.monotonic()
    deadline = t0 + seconds
    while True:
        while len(inflight) < depth and asked < budget and time.monotonic() < deadline:
            futs, n = batch.submit(reader, k % depth)
            inflight.append((futs, n))
            asked += n
            k += 1
        if not inflight:
            break
        futs, n = inflight.popleft()
        for f in futs:
            f.result()
        done += n
    return done, time.monotonic() - t0


def lanes_of(cells: Sequence[Cell]) -> int:
    """The most read lanes any cell asks for (--io-threads, else the engine's default): the roofline is the most
    the storage gives any of them."""
    got = [c.flags.get("--io-threads") for c in cells]
    asked = [v for v in got if isinstance(v, int) and not isinstance(v, bool) and 0 < v <= IO_THREADS_MAX]
    return max(asked or [DEFAULT_LANES])
