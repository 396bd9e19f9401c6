"""A file's sha256 remembered by where it is and what its stat says, so a large file is hashed once.

Keyed by the place (`local`, or an adb/ssh device) and the file's device number, inode, size and mtime, in
~/.cache/bmoe/sha256.json ($BMOE_HASH_CACHE): campaigns' provenance and `bmoe pull` share it, so a model the pull
verified is not hashed again when a campaign records it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

from harness.formats.files import atomic_write_text

CACHE_ENTRIES = 512
_cache_lock = threading.Lock()  # a fleet's workers hash at once: one writer of the cache file at a time


def cache_path() -> Path:
    env = os.environ.get("BMOE_HASH_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "bmoe" / "sha256.json"


def _load_cache(p: Path) -> dict[str, str]:
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}  # a missing or damaged (or hostile: nested 100,000 deep) cache only costs a re-hash
    return {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(obj, dict) \
        else {}


def _key(where: str, ident: tuple[int, int, int, int]) -> str:
    return f"{where}:" + ":".join(str(x) for x in ident)


def remember_sha256(where: str, ident: tuple[int, int, int, int], sha256: str) -> None:
    """Record the hash of the file `ident` = (device, inode, size, mtime) at `where` (a read-only home: not kept)."""
    p = cache_path()
    with _cache_lock:
        cache = _load_cache(p)  # another process may have added entries meanwhile
        cache[_key(where, ident)] = sha256
        cache = dict(list(cache.items())[-CACHE_ENTRIES:])  # the newest entries: files come and go
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(p, json.dumps(cache, indent=0) + "\n")
        except OSError:
            pass  # the hash stands, it is only not remembered


def cached_sha256(where: str, ident: tuple[int, int, int, int], compute: Callable[[], str]) -> str:
    """sha256 of the file `ident` = (device, inode, size, mtime) at `where`: from the cache, else
    compute() and remember it."""
    key = _key(where, ident)
    cache = _load_cache(cache_path())
    if key in cache:
        return cache[key]
    h = compute()
    remember_sha256(where, ident, h)
    return h


def stat_ident(st: os.stat_result) -> tuple[int, int, int, int]:
    """The cache's key of a local file from its stat."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
