"""Where a process's memory goes, from /proc/<pid>/smaps: every mapping put in one kind, with its resident bytes
(Rss), anonymous bytes and size summed per kind; and the cgroup's own view (memory.stat: anonymous, page cache,
kernel memory). Pure: text in, numbers out.

The kinds, in the order a mapping is tried:
- the model file (a `.gguf` mapping: llama.cpp's mmap of the weights);
- llama.cpp's libraries (libllama, libggml*); bmoe's C helpers (harness/engine/native);
- Python and its modules' code (the interpreter, libpython, lib-dynload, site-packages: numpy, pandas, ...);
- other files (libc, libstdc++, the C++ engine's own executable, ...);
- [heap]: glibc malloc's main arena (brk), Python's small objects above 512 bytes, C++ `new` of the main thread;
- malloc thread arenas: glibc gives each thread that calls malloc its own arena (up to 8 per core), a 64 MiB
  aligned reservation (an anonymous rw mapping at a 64 MiB boundary, with the PROT_NONE rest of the 64 MiB after it);
- thread stacks ([stack], and an anonymous rw mapping right above a small PROT_NONE guard);
- anonymous MAP_NORESERVE (VmFlags `nr`): bmoe's expert and dense-weight reservations and shared slots (and the
  C++ engine's own reservations where it makes them so);
- other anonymous: the rest (ggml's buffers: KV cache, compute buffer, model structures; Python's object arenas).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ARENA = 64 << 20  # glibc HEAP_MAX_SIZE on 64-bit
KINDS = ("model file", "llama.cpp libraries", "bmoe C helpers", "Python and modules (code)", "other files",
         "[heap] (malloc main arena)", "malloc thread arenas", "thread stacks", "anonymous MAP_NORESERVE",
         "other anonymous", "kernel-provided")
_HEAD = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ \d+\s*(.*)$")
_FIELD = re.compile(r"^(\w+):\s+(\d+) kB$")
_PY = re.compile(r"(^|/)(python3[\d.]*|libpython[\d.]*\.so[\d.]*)$|/site-packages/|/lib-dynload/|/lib/python3")


@dataclass
class Vma:
    start: int
    end: int
    perms: str
    path: str
    fields: dict[str, int] = field(default_factory=dict)  # bytes
    flags: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def anon(self) -> bool:
        return not self.path or self.path.startswith("[anon")


def parse_smaps(text: str) -> list[Vma]:
    out: list[Vma] = []
    for line in text.splitlines():
        m = _HEAD.match(line)
        if m:
            out.append(Vma(int(m[1], 16), int(m[2], 16), m[3], m[4].strip()))
            continue
        if not out:
            continue
        if line.startswith("VmFlags:"):
            out[-1].flags = tuple(line.split()[1:])
            continue
        f = _FIELD.match(line)
        if f:
            out[-1].fields[f[1]] = int(f[2]) * 1024
    return out


def parse_kv_kb(text: str) -> dict[str, int]:
    """smaps_rollup or /proc/<pid>/status: `Name: N kB` lines as bytes."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == "kB" and parts[0].endswith(":") and parts[1].isdigit():
            out[parts[0][:-1]] = int(parts[1]) * 1024
    return out


def _file_kind(path: str) -> str:
    base = path.rsplit("/", 1)[-1]
    if path.endswith(".gguf"):
        return "model file"
    if base.startswith(("libllama", "libggml")):
        return "llama.cpp libraries"
    if "/harness/engine/native/" in path:
        return "bmoe C helpers"
    if _PY.search(path):
        return "Python and modules (code)"
    return "other files"


def kinds(vmas: list[Vma]) -> list[str]:
    """The kind of each mapping (module docstring), in order."""
    out = []
    for i, v in enumerate(vmas):
        prev = vmas[i - 1] if i else None
        nxt = vmas[i + 1] if i + 1 < len(vmas) else None
        if v.path.startswith("[") and not v.path.startswith("[anon"):
            k = {"[heap]": "[heap] (malloc main arena)", "[stack]": "thread stacks"}.get(v.path, "kernel-provided")
        elif not v.anon:
            k = _file_kind(v.path)
        elif _arena(v, nxt):  # before `nr`: glibc maps its arenas MAP_NORESERVE too
            k = "malloc thread arenas"
        elif v.perms.startswith("---") and prev is not None and prev.anon and prev.end == v.start \
                and prev.start % ARENA == 0 and v.end - prev.start == ARENA:
            k = "malloc thread arenas"  # the PROT_NONE rest of an arena's 64 MiB
        elif "nr" in v.flags:
            k = "anonymous MAP_NORESERVE"
        elif (v.perms.startswith("---") and nxt is not None and nxt.anon and nxt.start == v.end
              and v.size <= 64 << 10) or (prev is not None and prev.anon and prev.end == v.start
                                          and prev.perms.startswith("---") and prev.size <= 64 << 10):
            k = "thread stacks"  # the guard page and the stack above it
        else:
            k = "other anonymous"
        out.append(k)
    return out


def _arena(v: Vma, nxt: Vma | None) -> bool:
    if v.start % ARENA or not v.perms.startswith("rw"):
        return False
    if v.size == ARENA:
        return True
    return nxt is not None and nxt.anon and nxt.start == v.end and nxt.perms.startswith("---") \
        and nxt.end - v.start == ARENA


@dataclass
class KindTotal:
    rss: int = 0
    anon: int = 0
    size: int = 0
    count: int = 0


def breakdown(vmas: list[Vma]) -> dict[str, KindTotal]:
    """Rss, anonymous bytes, size and mapping count per kind (every kind present, zero when absent)."""
    out = {k: KindTotal() for k in KINDS}
    for v, k in zip(vmas, kinds(vmas), strict=True):
        t = out[k]
        t.rss += v.fields.get("Rss", 0)
        t.anon += v.fields.get("Anonymous", 0)
        t.size += v.size
        t.count += 1
    return out


def parse_memory_stat(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if v.strip().lstrip("-").isdigit():
            out[k] = int(v)
    return out


def cgroup_charge(version: int, stat: dict[str, int], usage: int | None, kmem: int | None) -> dict[str, int | None]:
    """The cgroup's charge split into anonymous, page cache (file; of it, mapped into a process, and shared memory) and
    kernel memory, bytes. v1: rss, cache, mapped_file, shmem and memory.kmem.usage_in_bytes (charged within
    memory.usage_in_bytes); v2: anon, file, file_mapped, shmem and kernel."""
    if version == 1:
        return {"usage": usage, "anon": stat.get("rss", 0) + stat.get("rss_huge", 0), "file": stat.get("cache"),
                "file_mapped": stat.get("mapped_file"), "shmem": stat.get("shmem"), "kernel": kmem}
    kernel = stat.get("kernel")
    if kernel is None:
        kernel = sum(stat.get(k, 0) for k in ("kernel_stack", "pagetables", "slab", "sock", "percpu"))
    return {"usage": usage, "anon": stat.get("anon"), "file": stat.get("file"), "file_mapped": stat.get("file_mapped"),
            "shmem": stat.get("shmem"), "kernel": kernel}
