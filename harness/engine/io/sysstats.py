"""Process and machine readings for per-token telemetry (Linux /proc; -1 where unavailable)."""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

MIB = 1024 * 1024


def _kv_kb(path: str, keys: tuple[str, ...]) -> dict[str, float]:
    out = {k: -1.0 for k in keys}
    try:
        with open(path) as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in out:
                    out[k] = float(v.split()[0]) / 1024.0  # kB -> MiB
    except OSError:
        pass
    return out


def meminfo() -> dict[str, float]:
    return _kv_kb("/proc/meminfo", ("MemAvailable", "MemFree", "SwapFree", "MemTotal"))


def proc_status() -> dict[str, float]:
    return _kv_kb("/proc/self/status", ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmSwap", "VmHWM"))


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def thread_cpu(tids: list[int]) -> tuple[float, float]:
    """(user, system) CPU seconds of these threads of this process so far, summed (/proc/self/task/<tid>/stat, in
    clock ticks: 10 ms steps per thread); a thread that is gone counts 0."""
    user = system = 0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                rest = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        user += int(rest[11])
        system += int(rest[12])
    return user / _TICK, system / _TICK


def proc_io_read_bytes() -> int:
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return -1


def rusage() -> tuple[int, float]:
    """(major faults, CPU seconds user+sys) of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_majflt, r.ru_utime + r.ru_stime


def cgroup_memory() -> tuple[int | None, int | None]:
    """(limit bytes, usage bytes) of this process's memory cgroup, or (None, None) when unlimited."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        _, ctrl, path = line.split(":", 2)
        if ctrl == "":  # v2
            base = Path("/sys/fs/cgroup") / path.lstrip("/")
            lim, use = base / "memory.max", base / "memory.current"
        elif "memory" in ctrl.split(","):
            base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            lim, use = base / "memory.limit_in_bytes", base / "memory.usage_in_bytes"
        else:
            continue
        try:
            raw = lim.read_text().strip()
            if raw == "max" or int(raw) >= 1 << 60:
                continue
            return int(raw), int(use.read_text().strip())
        except (OSError, ValueError):
            continue
    return None, None


def host_description() -> str:
    u = os.uname()
    return f"{u.sysname} {u.release} {u.machine}, {os.cpu_count()} CPUs"


@dataclass(frozen=True)
class MemReading:
    """Memory as `--cache-mb auto` sees it at load."""

    available_mib: float  # /proc/meminfo MemAvailable
    cgroup_limit_bytes: int | None = None  # this process's memory cgroup limit, None when unlimited
    anon_mib: float = 0.0  # this process's RssAnon (already charged to the cgroup)


def memory_reading() -> MemReading:
    """MemAvailable, the memory cgroup's limit and this process's RssAnon (read only under a limit)."""
    lim, _use = cgroup_memory()
    return MemReading(meminfo()["MemAvailable"], lim, proc_status()["RssAnon"] if lim is not None else 0.0)


def psi_memory_path() -> tuple[Path | None, str]:
    """Where this process's memory pressure (PSI) is read: its cgroup's memory.pressure (cgroup v2), else
    the system's /proc/pressure/memory; (None, why) when neither is readable."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrl, path = line.split(":", 2)
            if ctrl == "":
                p = Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.pressure"
                if psi_some_us(p) >= 0:
                    return p, f"cgroup PSI ({p})"
    except (OSError, ValueError):
        pass
    p = Path("/proc/pressure/memory")
    if psi_some_us(p) >= 0:
        return p, "system-wide PSI (/proc/pressure/memory: other processes' stalls count too)"
    return None, "unmeasured: no PSI here (kernel without CONFIG_PSI, or psi=0)"


def psi_some_us(path: Path) -> int:
    """The `some` line's total stall time in microseconds, or -1 when unreadable."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith("some "):
                return int(line.rsplit("total=", 1)[1])
    except (OSError, ValueError, IndexError):
        pass
    return -1
