"""Measure how fast the model's storage reads, for the report's I/O roofline (local targets).

Random 1 MiB-aligned reads of the model file with O_DIRECT (page cache bypassed), 4 threads, for at most
`seconds` or `max_mib`. Where O_DIRECT is refused the reads are buffered after POSIX_FADV_DONTNEED and the
method says so."""

from __future__ import annotations

import mmap
import os
import random
import threading
import time
from pathlib import Path

BLOCK = 1 << 20


def probe_read_bandwidth(path: Path, *, seconds: float = 3.0, max_mib: int = 512, threads: int = 4,
                         seed: int = 0) -> dict:
    try:
        size = path.stat().st_size
    except OSError as e:
        return {"mib_s": None, "method": f"not measured: {e.strerror}"}
    n_blocks = size // BLOCK
    if n_blocks < 1:
        return {"mib_s": None, "method": "not measured: model smaller than 1 MiB"}
    direct = hasattr(os, "O_DIRECT")
    try:
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    except OSError:
        direct = False
        fd = os.open(path, os.O_RDONLY)
    if not direct:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    rng = random.Random(seed)
    offsets = [rng.randrange(n_blocks) * BLOCK for _ in range(min(max_mib, n_blocks * 4))]
    lock = threading.Lock()
    total = [0]
    deadline = time.monotonic() + seconds

    def worker() -> None:
        buf = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT needs
        while time.monotonic() < deadline:
            with lock:
                if not offsets:
                    return
                off = offsets.pop()
            try:
                n = os.preadv(fd, [buf], off)
            except OSError:
                return
            with lock:
                total[0] += n

    t0 = time.monotonic()
    ws = [threading.Thread(target=worker) for _ in range(threads)]
    for w in ws:
        w.start()
    for w in ws:
        w.join()
    dt = time.monotonic() - t0
    os.close(fd)
    mib = total[0] / 2**20
    method = (f"{'O_DIRECT' if direct else 'buffered after fadvise DONTNEED'} random 1 MiB reads, {threads} "
              f"threads, {mib:.0f} MiB in {dt:.2f} s")
    return {"mib_s": round(mib / dt, 1) if dt > 0 and mib > 0 else None, "method": method}
