"""Writing a stored file so that a reader never sees half of it, the hash that proves it unchanged, and a
full disk as one line.

`atomic_write_*` write a sibling `.NAME.<pid>.tmp` (per process: two writers never share a temporary
file), fsync it and rename it over the target: after a crash the file is either the old one or the new
one. A write that fails removes its temporary file; a full disk (ENOSPC, EDQUOT) becomes `DiskFull`, one
line naming the path, the bytes it needed and the space left. `sha256_file` is the digest the manifest
records for every raw file of a committed run. `is_temp_name` tells the temporary names apart (a report
check flags any left over)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

from harness.errors import ResourceError, UserError

_FULL = (errno.ENOSPC, errno.EDQUOT)
_DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)
_TEMP = re.compile(r"^\..+\.tmp$")


class DiskFull(ResourceError):
    """No space left where a stored file was being written."""

    exit_code = 28  # ENOSPC

    @property
    def head(self) -> str:
        """The message without its advice: the path and the space."""
        return str(self).split("; ", 1)[0]


def is_disk_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in _FULL


def free_bytes(path: Path | str) -> int | None:
    """Bytes free to an unprivileged writer on the filesystem holding path (or its nearest parent)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def not_writable(path: Path | str, e: OSError) -> UserError | None:
    """A write refused by permissions or a read-only filesystem as one line naming the folder (else None)."""
    if e.errno not in _DENIED:
        return None
    p = Path(path)
    return UserError(f"{p.parent}: cannot write {p.name} there ({e.strerror}); make the folder writable, or copy "
                     f"it somewhere you can write and run the command there")


def mib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / 2**20:.1f} MiB"


def disk_full(path: Path | str, needed: int | None, what_next: str = "free some space and run the command "
                                                                     "again") -> DiskFull:
    """The one-line error for a full disk while writing path (needed: the bytes being written, if known)."""
    need = f"needs {mib(needed)}, " if needed is not None else ""
    return DiskFull(f"{path}: disk full ({need}{mib(free_bytes(path))} free there); {what_next}")


def temp_name(path: Path | str) -> Path:
    """This process's temporary sibling of path."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def is_temp_name(name: str) -> bool:
    return bool(_TEMP.match(name))


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    path = Path(path)
    tmp = temp_name(path)
    try:
        with open(tmp, "wb", opener=_no_follow) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if is_disk_full(e):
            raise disk_full(path, len(data)) from None
        if isinstance(e, OSError) and (denied := not_writable(path, e)) is not None:
            raise denied from None
        raise


def _no_follow(path: str, flags: int) -> int:
    """open()'s opener for a temporary file: never through a symbolic link planted under its name."""
    return os.open(path, flags | os.O_NOFOLLOW, 0o666)


def atomic_write_text(path: Path | str, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path | str, obj: object) -> None:
    """One-space indented JSON with a final newline, keys in the order given."""
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=False) + "\n")


def copy_file(src: Path | str, dest: Path | str) -> None:
    """shutil.copy2, a full disk as DiskFull (a partial copy removed)."""
    try:
        shutil.copy2(src, dest)
    except OSError as e:
        if not is_disk_full(e):
            raise
        Path(dest).unlink(missing_ok=True)
        raise disk_full(dest, _size(src)) from None


def _size(p: Path | str) -> int | None:
    try:
        return os.stat(p).st_size
    except OSError:
        return None


def sha256_file(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
