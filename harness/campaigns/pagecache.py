"""Evict a model's file(s) from the page cache before a run, without root.

A page already cached was charged to whichever cgroup first read it, so a memory cap only bites on a
model that is not cached: without this, a plain mmap run under the cap can read a file the generator
left in the cache for free. posix_fadvise(DONTNEED) drops clean, unmapped pages of that file only."""

from __future__ import annotations

import os
import re
from pathlib import Path

_SHARD = re.compile(r"^(?P<stem>.*)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$")


def model_files(first: Path) -> list[Path]:
    """The model file, or every shard of a split model given its first shard."""
    m = _SHARD.match(first.name)
    if not m:
        return [first]
    n = int(m["n"])
    return [first.with_name(f"{m['stem']}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]


def evict_model_files(first: Path) -> dict:
    """Drop the cached pages of the model file(s). Returns what was done, for the run record."""
    done, errors = [], []
    for p in model_files(first):
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError as e:
            errors.append(f"{p.name}: {e.strerror}")
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            done.append(p.name)
        except OSError as e:
            errors.append(f"{p.name}: {e.strerror}")
        finally:
            os.close(fd)
    return {"method": "posix_fadvise DONTNEED", "files": done, "errors": errors}
