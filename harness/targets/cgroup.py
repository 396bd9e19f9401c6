"""A memory cap for one process tree through a cgroup child that we create and remove.

cgroup v2 (`memory.max`, `memory.events`, `memory.peak`) where the memory controller is available to our
own cgroup; else cgroup v1 (`memory.limit_in_bytes`, `memory.oom_control`, `memory.max_usage_in_bytes`)
under the memory hierarchy's mount, at our own path from /proc/self/cgroup. Only children named
`bmoe-<pid>-<n>` under our own cgroup are ever created or removed. File-backed page cache is charged to
the cgroup, so a plain mmap of a model bigger than the cap thrashes as it would on a phone. Swap is
capped too (memsw / swap.max) where the kernel accounts it, so the cap is a cap on RAM.

The process is put in the child before it can allocate: it is started as
`sh -c 'echo $$ > <child>/cgroup.procs && exec "$@"' <procs> argv...` (see `wrap_argv`).
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UserError

_counter = itertools.count()
_CHILD_RE = re.compile(r"^bmoe-(\d+)-(\d+)$")


@dataclass(frozen=True)
class CgroupBase:
    """Our own cgroup in the hierarchy that has the memory controller."""

    version: int  # 1 or 2
    dir: Path  # our own cgroup's directory; children are made here


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """/proc/self/cgroup -> {controller: path}; the v2 entry ("0::/path") is keyed ""."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


def parse_mountinfo(text: str) -> list[tuple[str, str, str, set[str]]]:
    """/proc/self/mountinfo -> [(fstype, mount root, mount point, super options)] for cgroup mounts."""
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        lf, rf = left.split(), right.split()
        if len(lf) < 5 or len(rf) < 3 or rf[0] not in ("cgroup", "cgroup2"):
            continue
        out.append((rf[0], _unescape(lf[3]), _unescape(lf[4]), set(rf[2].split(","))))
    return out


def _unescape(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def _join(mount_point: str, mount_root: str, path: str) -> Path:
    """Our cgroup dir: the mount point plus our path relative to the mount's root (cgroup namespaces)."""
    rel = path
    if mount_root != "/" and (path == mount_root or path.startswith(mount_root + "/")):
        rel = path[len(mount_root) :]
    return Path(mount_point) / rel.lstrip("/")


def locate(proc_cgroup: str, mountinfo: str) -> CgroupBase:
    """Where our memory-capped children can go: v2 if its memory controller is usable, else v1.
    Raises UserError naming what is missing."""
    own = parse_proc_cgroup(proc_cgroup)
    mounts = parse_mountinfo(mountinfo)
    if "" in own:
        for fstype, root, point, _ in mounts:
            if fstype != "cgroup2":
                continue
            d = _join(point, root, own[""])
            controllers = _read(d / "cgroup.controllers")
            if controllers is not None and "memory" in controllers.split():
                return CgroupBase(2, d)
    if "memory" in own:
        for fstype, root, point, opts in mounts:
            if fstype == "cgroup" and "memory" in opts:
                d = _join(point, root, own["memory"])
                if (d / "memory.limit_in_bytes").exists():
                    return CgroupBase(1, d)
    raise UserError(
        "memory cap: no usable cgroup memory controller (neither cgroup v2 with 'memory' in "
        "cgroup.controllers nor a v1 memory hierarchy); run without mem_cap_mib, or under "
        "`systemd-run --user --scope -p MemoryMax=...`"
    )


def locate_self() -> CgroupBase:
    return locate(Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text())


def _read(p: Path) -> str | None:
    try:
        return p.read_text()
    except OSError:
        return None


def _write(p: Path, value: str) -> None:
    with open(p, "w") as f:
        f.write(value)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ensure_v2_subtree(base: Path) -> None:
    ctl = base / "cgroup.subtree_control"
    if "memory" in (_read(ctl) or "").split():
        return
    try:
        _write(ctl, "+memory")
    except OSError as e:
        raise UserError(
            f"memory cap: cannot enable the memory controller for children of {base} ({e.strerror}); "
            "cgroup v2 refuses it while that cgroup holds processes: run the harness in its own cgroup "
            "(e.g. `systemd-run --user --scope -p Delegate=yes bmoe-bench ...`) or without a memory cap"
        ) from e


class CappedCgroup:
    """One child cgroup with a memory limit. Use as a context manager, or call remove()."""

    def __init__(self, base: CgroupBase, limit_mib: int):
        if limit_mib <= 0:
            raise UserError(f"memory cap: {limit_mib} MiB is not a positive size")
        self.base = base
        self.limit_mib = limit_mib
        remove_stale(base)
        self.dir = base.dir / f"bmoe-{os.getpid()}-{next(_counter)}"
        limit = str(limit_mib * 1024 * 1024)
        if base.version == 2:
            _ensure_v2_subtree(base.dir)
        try:
            self.dir.mkdir()
        except OSError as e:
            raise UserError(f"memory cap: cannot create cgroup {self.dir} ({e.strerror}); run as root") from e
        try:
            if base.version == 2:
                _write(self.dir / "memory.max", limit)
                if (self.dir / "memory.swap.max").exists():
                    _write(self.dir / "memory.swap.max", "0")
            else:
                _write(self.dir / "memory.limit_in_bytes", limit)
                if (self.dir / "memory.memsw.limit_in_bytes").exists():
                    _write(self.dir / "memory.memsw.limit_in_bytes", limit)
        except OSError as e:
            self.remove()
            raise UserError(f"memory cap: cannot set {limit_mib} MiB on {self.dir} ({e.strerror})") from e

    @property
    def procs_file(self) -> Path:
        return self.dir / "cgroup.procs"

    def wrap_argv(self, argv: list[str]) -> list[str]:
        """argv started so that the process enters this cgroup before exec (so before it allocates)."""
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.procs_file), *argv]

    def add(self, pid: int) -> None:
        _write(self.procs_file, str(pid))

    def pids(self) -> list[int]:
        return [int(x) for x in (_read(self.procs_file) or "").split()]

    @property
    def oom_file(self) -> str:
        """Where the kernel counts this cgroup's OOM kills (the `oom_kill` line)."""
        return "memory.events" if self.base.version == 2 else "memory.oom_control"

    def oom_kills(self) -> int:
        """How many processes the OOM killer has killed in this cgroup (v1 oom_control / v2 events)."""
        for line in (_read(self.dir / self.oom_file) or "").splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill" and v.strip().isdigit():
                return int(v)
        return 0

    def peak_bytes(self) -> int | None:
        name = "memory.peak" if self.base.version == 2 else "memory.max_usage_in_bytes"
        s = (_read(self.dir / name) or "").strip()
        return int(s) if s.isdigit() else None

    def kill_all(self) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def remove(self, wait_s: float = 5.0) -> None:
        """Kill anything left inside, then rmdir (retried while the kernel finishes the exits)."""
        if not self.dir.exists():
            return
        deadline = time.monotonic() + wait_s
        while True:
            self.kill_all()
            try:
                self.dir.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as e:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cannot remove cgroup {self.dir}: {e.strerror}") from e
                time.sleep(0.05)

    def __enter__(self) -> CappedCgroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def remove_stale(base: CgroupBase) -> list[Path]:
    """Remove empty bmoe-<pid>-<n> children left by harness processes that no longer exist."""
    removed = []
    try:
        entries = list(base.dir.iterdir())
    except OSError:
        return removed
    for d in entries:
        m = _CHILD_RE.match(d.name)
        if not m or not d.is_dir() or pid_alive(int(m.group(1))):
            continue
        try:
            d.rmdir()
            removed.append(d)
        except OSError:
            pass  # still holds processes: leave it to whoever owns them
    return removed
