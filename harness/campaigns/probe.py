"""Measure how fast the model's storage reads the way the engine reads it, for the report's I/O roofline (local
targets).

The engine's own read lanes (harness.engine.io.reader.SliceReader: the compiled lanes where built, O_DIRECT where the
filesystem allows it) read what a streamed token reads: for each MoE layer in turn, the whole slices of top-k
distinct random experts of every streamed tensor of that layer, handed over as one batch. `depth` layers' batches
are in flight at once (2: the next layer's reads queued while the current one's finish, as read-ahead does), so the
figure is the most the lanes get from this storage, an upper bound for a cell's reads, not what one cell got. The
reads land in buffers faulted once before the clock starts (the storage and the lanes are measured, not the page
faults of fresh memory; --recycle-pages is about those). The 1 MiB reads this replaced understated the lanes by up
to 2.7x on this machine (bench-data/2026-12-03-gptoss-local-quiet: cells at 121-273% of that roofline)."""

from __future__ import annotations

import ctypes
import mmap
import os
import random
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from harness.campaigns.expand import Cell
from harness.engine.config.fields import IO_THREADS_MAX
from harness.engine.io.reader import SliceReader
from harness.engine.model.gguf_layout import ModelLayout, load_layout
from harness.errors import UserError

PAGE = mmap.PAGESIZE
DEFAULT_LANES = 4  # the engine's --io-threads default (harness.engine.config.fields)


def _not(why: str) -> dict:
    return {"mib_s": None, "method": f"not measured: {why}"}


def probe_read_bandwidth(path: Path, *, lanes: int = DEFAULT_LANES, seconds: float = 3.0, max_mib: int = 2048,
                         depth: int = 2, seed: int = 0) -> dict:
    """{"mib_s": MiB/s of expert slices read (None when not measured), "method": how, in one line}."""
    try:
        lay = load_layout(path)
    except (UserError, OSError, ValueError) as e:
        return _not(str(e))
    layers = [il for il in lay.moe_layers if lay.by_layer.get(il)]
    if not layers:
        return _not(f"{path}: no streamed expert tensors")
    slot = max(t.nb2 for il in layers for t in lay.by_layer[il]) + 3 * PAGE
    slot = (slot + PAGE - 1) // PAGE * PAGE
    per_batch = max(_top_k(lay, il) * len(lay.by_layer[il]) for il in layers)
    buf = mmap.mmap(-1, slot * per_batch * depth)
    for off in range(0, len(buf), PAGE):  # fault every page now: the clock measures the reads only
        buf[off] = 1
    view = (ctypes.c_char * len(buf)).from_buffer(buf)  # the buffer's address; released before buf closes
    base = ctypes.addressof(view)
    try:
        reader = SliceReader(lay.shards, lanes, odirect=True)
    except OSError as e:
        del view
        buf.close()
        return _not(f"{path}: {e.strerror}")
    if reader.odirect_refused:
        for fd in reader.fd_buf.values():
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    rng = random.Random(seed)
    budget = max_mib << 20
    inflight: deque = deque()
    done_bytes = asked = batches = 0
    t0 = time.monotonic()
    deadline = t0 + seconds
    try:
        i = 0
        while True:
            while len(inflight) < depth and asked < budget and time.monotonic() < deadline:
                il = layers[i % len(layers)]
                i += 1
                futs, n = _submit(reader, lay, il, rng, base + (batches % depth) * per_batch * slot, slot)
                inflight.append((futs, n))
                asked += n
                batches += 1
            if not inflight:
                break
            futs, n = inflight.popleft()
            for f in futs:
                f.result()
            done_bytes += n
        dt = time.monotonic() - t0
    except OSError as e:
        return _not(f"{path}: {e}")
    finally:
        reader.close()
        del view
        buf.close()
    mib = done_bytes / 2**20
    k = sorted({_top_k(lay, il) for il in layers})
    kb = sum(t.nb2 for il in layers for t in lay.by_layer[il]) / sum(len(lay.by_layer[il]) for il in layers) / 1024
    how = "buffered after fadvise DONTNEED (O_DIRECT refused)" if reader.odirect_refused else "O_DIRECT"
    method = (f"the engine's read lanes ({reader.lanes_impl}, {lanes} lanes, {how}): each MoE layer's top-"
              f"{'/'.join(map(str, k))} random experts' whole slices (mean {kb:.0f} KiB) as one batch, {depth} "
              f"layers in flight; {mib:.0f} MiB in {dt:.2f} s")
    return {"mib_s": round(mib / dt, 1) if dt > 0 and mib > 0 else None, "method": method}


def lanes_of(cells: Sequence[Cell]) -> int:
    """The most read lanes any cell asks for (--io-threads, else the engine's default): the roofline is the most
    the storage gives any of them."""
    got = [c.flags.get("--io-threads") for c in cells]
    asked = [v for v in got if isinstance(v, int) and not isinstance(v, bool) and 0 < v <= IO_THREADS_MAX]
    return max(asked or [DEFAULT_LANES])


def _top_k(lay: ModelLayout, il: int) -> int:
    used = lay.expert_used_by_layer
    k = used[il] if il < len(used) and used[il] else lay.n_expert_used
    return max(1, min(k, lay.n_expert))


def _submit(reader: SliceReader, lay: ModelLayout, il: int, rng: random.Random, base: int, slot: int) -> tuple:
    """One layer's batch: top-k distinct random experts of each of its streamed tensors, each slice read into its
    own slot at an address congruent to its file offset (as O_DIRECT and the engine's reservations need)."""
    experts = rng.sample(range(lay.n_expert), _top_k(lay, il))
    tensors, n, j = [], 0, 0
    for t in lay.by_layer[il]:
        reads = []
        for e in experts:
            pos = t.abs_offset + e * t.nb2
            reads.append((pos, t.nb2, base + j * slot + PAGE + pos % PAGE, None))
            n += t.nb2
            j += 1
        tensors.append((t.path, reads))
    return reader.submit_layer(tensors), n
