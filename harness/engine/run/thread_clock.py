"""What a generation's decode cost the engine's own threads, for the summary line: the read lanes' user and kernel CPU
(and kernel ms per MiB read), the compute thread's and the page releaser's CPU, and the memory map and shared memory
at the end (the VMAs against vm.max_map_count, RssShmem, the memory cgroup's charge). These are what
`--recycle-pages` changes (harness.engine.io.recycle), measured the same way with it and without; /proc's clock
ticks (10 ms per thread) make them coarse over a few tokens."""

from __future__ import annotations

import threading

from harness.engine.io import recycle, sysstats
from harness.engine.io.reader import ExpertReader
from harness.engine.stream.hook import StreamHook

MIB = 1048576


class ThreadClock:
    """Started when the decode starts (after the prompt's batch); `summary(read_bytes)` at its end."""

    def __init__(self, hook: StreamHook, reader: ExpertReader):
        self.reader, self.hook = reader, hook
        self.tids = {"lanes": reader.lane_tids(), "releaser": [hook.releases.releaser.tid],
                     "main": [threading.get_native_id()]}
        self.t0 = {k: sysstats.thread_cpu(v) for k, v in self.tids.items()}

    def summary(self, read_bytes: int) -> dict[str, object]:
        now = {k: sysstats.thread_cpu(v) for k, v in self.tids.items()}
        d = {k: (now[k][0] - self.t0[k][0], now[k][1] - self.t0[k][1]) for k in now}
        lanes_sys_ms = d["lanes"][1] * 1e3
        mib = read_bytes / MIB
        _lim, use = sysstats.cgroup_memory()
        out: dict[str, object] = {
            "lanes_user_ms": round(d["lanes"][0] * 1e3, 1), "lanes_sys_ms": round(lanes_sys_ms, 1),
            "lanes_sys_ms_per_mib": round(lanes_sys_ms / mib, 4) if mib > 0 else -1,
            "main_cpu_ms": round(sum(d["main"]) * 1e3, 1), "releaser_cpu_ms": round(sum(d["releaser"]) * 1e3, 1),
            "vmas": recycle.vma_count(), "max_map_count": recycle.max_map_count(),
            "rss_shmem_mib": round(sysstats.proc_status()["RssShmem"], 1),
            "cgroup_usage_mib": round(use / MIB, 1) if use is not None else -1,
        }
        pool = self.hook.binds.pool
        if pool is not None:
            st = pool.stats()
            st["pool_mib"] = round(st.pop("pool_bytes") / MIB, 3)
            out.update(st)
        return out
