"""The candidates for --recycle-pages side by side, outside the engine (issue 25 item 1): one thread reads expert slices
of a real model file into reservations as a cache's misses would, the oldest resident slice evicted after each miss,
and each candidate decides where a miss's pages come from and what an eviction does with them:

- `dontneed`: today's engine without the flag: the evicted slice's pages freed (MADV_DONTNEED); each miss faults,
  zeroes and charges fresh anonymous pages inside its read;
- `move`: `--recycle-pages move` (harness.engine.io.recycle_move, clanes_move.c): the eviction keeps the pages where
  they are; before the read they are moved into the miss's whole pages with UFFDIO_MOVE;
- `memfd`: `--recycle-pages memfd` (harness.engine.io.recycle, clanes_pool.c): a free memfd chunk mapped over the
  miss's whole pages with MAP_FIXED | MAP_POPULATE before the read; the eviction maps anonymous memory back and frees
  the chunk;
- `memfd-lazy`: the same without MAP_POPULATE (the read itself takes a minor fault per page; no zeroing; Python twin);
- `mremap`: the evicted slice's anonymous pages moved to the miss's address (mremap MREMAP_FIXED), its hole refilled
  with an anonymous mapping;
- `resident`: the floor: every read into pages already faulted (one shared slot, as without a cache).

Per candidate: kernel and user CPU of the reading thread per MiB read (getrusage RUSAGE_THREAD), the same for the
eviction step (on the engine it runs on the page releaser's thread), the mappings (VMAs) at the end against
vm.max_map_count, and RssAnon/RssShmem. `python -m harness.engine.diag.recycle_probe MODEL [--misses N] [--resident R]
[--no-odirect] [--python]` (--python: the pools' Python twins instead of the compiled ones). One thread, one read at
a time: the lanes' parallelism and the compute thread's contention for the kernel's locks are not in it (the engine's
summary measures those: lanes_sys_ms_per_mib, main_cpu_ms)."""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import resource
import time
from pathlib import Path

from harness.engine.io import clanes, recycle, sysstats
from harness.engine.io.vm import PAGE, Reservation
from harness.engine.model.gguf_layout import load_layout

MIB = 1048576
CANDIDATES = ("dontneed", "move", "memfd", "memfd-lazy", "mremap", "resident")
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mremap.restype = ctypes.c_void_p
_libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
_MREMAP_MAYMOVE, _MREMAP_FIXED = 1, 2


def _cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_THREAD)
    return r.ru_utime, r.ru_stime


class _Lazy(recycle.PyPagePool):
    """memfd chunks mapped without MAP_POPULATE."""

    def attach(self, addr: int, length: int) -> int:
        saved = recycle._MAP_POPULATE
        recycle._MAP_POPULATE = 0
        try:
            return super().attach(addr, length)
        finally:
            recycle._MAP_POPULATE = saved


def _read(fd: int, direct: bool, pos: int, n: int, addr: int, size: int) -> int:
    if direct:
        a = pos // PAGE * PAGE
        b = min((pos + n + PAGE - 1) // PAGE * PAGE, (size + PAGE - 1) // PAGE * PAGE)
        pos, n, addr = a, b - a, addr - (pos - a)
    got = 0
    while got < n:
        k = os.preadv(fd, [memoryview((ctypes.c_char * (n - got)).from_address(addr + got)).cast("B")], pos + got)
        if k <= 0:
            raise OSError(f"short read at {pos + got}")
        got += k
    return got


def probe(model: str, candidate: str, misses: int, resident: int, odirect: bool, python: bool = False,
          seed: int = 1) -> dict[str, float]:
    lay = load_layout(model)
    ets = sorted(lay.experts.values(), key=lambda t: (t.layer, t.name))
    nb2 = max(t.nb2 for t in ets)
    ets = [t for t in ets if t.nb2 == nb2][:8]  # up to 8 tensors of the largest slice size
    path = ets[0].path
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if odirect else 0))
    size = os.fstat(fd).st_size
    pool: recycle.PagePool | None = None
    lib = None if python else clanes.load()
    chunk = -(-(nb2 // PAGE) // recycle.GRANULE) * recycle.GRANULE * PAGE
    if candidate == "memfd-lazy":
        pool = _Lazy((resident + 2) * chunk)
    elif candidate in ("memfd", "move"):  # memfd: every resident slice and two more; move: two evicted slices
        pool = recycle.make_pool(candidate, (resident + 2) * chunk if candidate == "memfd" else 2 * nb2, lib)
    slot = Reservation(nb2 + PAGE, 0)  # `resident`: one buffer, its pages faulted by the first read only
    if candidate == "resident":
        res = {t.name: slot for t in ets}
    else:
        res = {t.name: Reservation(t.nbytes, t.abs_offset, pool) for t in ets}
    rng = random.Random(seed)
    keys = [(t, e) for t in ets for e in range(t.n_expert)]
    rng.shuffle(keys)
    cached: list[tuple[object, int]] = []
    read_cpu = [0.0, 0.0]
    evict_cpu = [0.0, 0.0]
    nbytes = 0
    t_wall = time.perf_counter()
    for i in range(misses):
        t, e = keys[i % len(keys)]
        pos = t.abs_offset + e * nb2
        r = res[t.name]
        addr = slot.data + pos % PAGE if candidate == "resident" else r.addr_of(pos)
        u0, s0 = _cpu()
        if pool is not None:
            pool.attach(addr, nb2)  # type: ignore[attr-defined]
        nbytes += _read(fd, odirect, pos, nb2, addr, size)
        u1, s1 = _cpu()
        read_cpu[0] += u1 - u0
        read_cpu[1] += s1 - s0
        cached.append((t, e))
        if len(cached) > resident:
            ot, oe = cached.pop(0)
            u0, s0 = _cpu()
            orr = res[ot.name]
            opos = ot.abs_offset + oe * nb2
            if candidate == "mremap":  # the evicted slice's pages moved to where the next miss reads (in the engine
                # a lane's step before that read)
                nt, ne = keys[(i + 1) % len(keys)]
                npos = nt.abs_offset + ne * nb2
                src, dst = orr.pages(opos, opos + nb2), res[nt.name].pages(npos, npos + nb2)
                if src and dst:
                    n = min(src[1], dst[1])
                    moved = _libc.mremap(src[0], n, n, _MREMAP_MAYMOVE | _MREMAP_FIXED, dst[0])
                    if moved == ctypes.c_void_p(-1).value:
                        raise OSError(ctypes.get_errno(), "mremap failed")
                    recycle._anon(src[0], n)
            elif candidate != "resident":
                orr.release(opos, opos + nb2)
            u1, s1 = _cpu()
            evict_cpu[0] += u1 - u0
            evict_cpu[1] += s1 - s0
    wall = time.perf_counter() - t_wall
    mib = nbytes / MIB
    ps = sysstats.proc_status()
    out = {"candidate": candidate, "odirect": int(odirect), "pools": "python" if python or lib is None else "c",
           "mib_read": round(mib, 1), "wall_s": round(wall, 3),
           "read_sys_ms_per_mib": round(read_cpu[1] * 1e3 / mib, 4),
           "read_user_ms_per_mib": round(read_cpu[0] * 1e3 / mib, 4),
           "evict_sys_ms_per_mib": round(evict_cpu[1] * 1e3 / mib, 4),
           "evict_user_ms_per_mib": round(evict_cpu[0] * 1e3 / mib, 4),
           "vmas": recycle.vma_count(), "max_map_count": recycle.max_map_count(),
           "rss_anon_mib": ps["RssAnon"], "rss_shmem_mib": ps["RssShmem"]}
    if pool is not None:
        out.update({k: v for k, v in pool.stats().items() if k in ("pool_recycled", "pool_fresh", "pool_fallback",
                                                                   "pool_errors")})
    os.close(fd)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m harness.engine.diag.recycle_probe",
                                 description=(__doc__ or "").split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--misses", type=int, default=2000)
    ap.add_argument("--resident", type=int, default=64, help="slices kept resident (the cache)")
    ap.add_argument("--no-odirect", action="store_true")
    ap.add_argument("--candidates", default=",".join(CANDIDATES))
    ap.add_argument("--python", action="store_true", help="the pools' Python twins")
    a = ap.parse_args(argv)
    if not Path(a.model).is_file():
        raise SystemExit(f"{a.model}: no such model file")
    for c in a.candidates.split(","):
        print(json.dumps(probe(a.model, c, a.misses, a.resident, not a.no_odirect, a.python)), flush=True)


if __name__ == "__main__":
    main()
