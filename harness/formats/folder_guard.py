"""A campaign folder is untrusted input: reviewers audit folders other people committed. What every command
checks when it opens one, before it reads a file of the folder or writes one into it:

- `refuse_links(folder)`: nothing inside is a symbolic link or a special file (FIFO, socket, device), and
  nothing is nested deeper than bmoe-bench ever writes. A link would make a write, a delete or a hash land
  outside the folder; a FIFO would hang a read. One line naming them.
- `inside(folder, path)`: a path built from a value the folder holds (a run id) resolves inside the folder.
- `read_json(path, limit)`: one of the folder's JSON files, opened without following a link, refused as
  one line naming it when larger than `limit` bytes, nested deeper than `MAX_DEPTH`, or not UTF-8 JSON.
- `read_bytes(path, limit)`, `read_text(path, limit)`: any other file of the folder, likewise (its size read
  from the open file before a byte of it is: a 200 GB sparse file is refused at once, never read);
  `read_capped(path, limit)` the same for a file the user named (a link followed).
- `loads(text, where)`: one JSON value (a line of a JSONL file), its nesting bounded as read_json's.
- `sha256_plain(path, limit)`: the sha256 of one of the folder's files, opened as read_bytes opens it and
  refused when larger than `limit` (a raw file's tamper check must end).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from harness.errors import UserError

MAX_RAW = 64 * 2**20  # a run's raw file read by the report (the largest committed: 4 MB; a metrics row is ~160 B)
MAX_DEPTH = 32  # JSON nesting (a manifest needs ~8) and folder depth (runs/<id>/attempt-<n>/<file> is 4)
_SHOWN = 5  # offending names shown in the one line


def shown(text: str, n: int = 60) -> str:
    """A value from an untrusted file, safe to put in a one-line message: escaped, at most n characters."""
    r = repr(text)
    return r if len(r) <= n else r[: n - 4] + "...'"


def refuse_links(folder: Path | str) -> None:
    """UserError naming every symbolic link, special file or too deeply nested entry inside folder (the
    folder itself may be a link the user named)."""
    folder = Path(folder)
    bad: list[str] = []
    stack: list[tuple[str, int]] = [(str(folder), 0)]
    while stack:  # iterative: a hostile folder nested thousands deep must not exhaust the recursion limit
        d, depth = stack.pop()
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError as e:
            raise UserError(f"{d}: cannot list this folder ({e.strerror})") from None
        for e in entries:
            rel = Path(e.path).relative_to(folder).as_posix()
            st = e.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                if depth + 1 >= MAX_DEPTH:
                    bad.append(f"{shown(rel)} (nested deeper than {MAX_DEPTH})")
                else:
                    stack.append((e.path, depth + 1))
            elif stat.S_ISLNK(st.st_mode):
                bad.append(f"{shown(rel)} (a symbolic link)")
            elif not stat.S_ISREG(st.st_mode):
                bad.append(f"{shown(rel)} (not a plain file)")
    if bad:
        more = f" and {len(bad) - _SHOWN} more" if len(bad) > _SHOWN else ""
        raise UserError(f"{folder}: refused: {', '.join(sorted(bad)[:_SHOWN])}{more}; a campaign folder holds only "
                        f"plain files and folders (a link could make bmoe-bench read or write outside it): "
                        f"put the files themselves there, or remove these")


def inside(folder: Path | str, path: Path) -> Path:
    """path, when it resolves inside folder (else a UserError naming both)."""
    if not path.resolve().is_relative_to(Path(folder).resolve()):
        raise UserError(f"{folder}: {shown(str(path))} resolves outside the folder; refused")
    return path


def _open_plain(path: Path | str) -> int:
    """A descriptor of the plain file `path`, never through a link, never blocking on a FIFO (FileNotFoundError
    when it is missing; anything else not a plain file is a UserError naming it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as e:
        why = "a symbolic link" if e.errno == errno.ELOOP else e.strerror
        raise UserError(f"{path}: cannot be read ({why}); restore the file bmoe-bench wrote") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(f"{path}: not a plain file; restore the file bmoe-bench wrote")
    return fd


class NotOurs(UserError):
    """A file no bmoe-bench writes (far too large, nested too deep): the folder is refused, where a damaged file
    only makes its run invalid."""


def too_large(path: Path | str, limit: int) -> NotOurs:
    return NotOurs(f"{path}: larger than {limit / 2**20:g} MiB, far beyond any file bmoe-bench writes; this file "
                     f"was not written by bmoe-bench")


def read_bytes(path: Path | str, limit: int) -> bytes:
    """The bytes of one of a folder's files, at most `limit` of them (FileNotFoundError when it is missing)."""
    with os.fdopen(_open_plain(path), "rb") as f:
        if os.fstat(f.fileno()).st_size > limit:
            raise too_large(path, limit)
        data = f.read(limit + 1)  # it may have grown since the fstat
    if len(data) > limit:
        raise too_large(path, limit)
    return data


def _open_capped(path: Path | str, limit: int):  # noqa: ANN202 (a binary file object)
    """A user-named file (a link followed) opened for reading: a plain file of at most `limit` bytes, or refused
    without waiting on it."""
    f = os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb")
    st = os.fstat(f.fileno())
    if not stat.S_ISREG(st.st_mode):
        f.close()
        raise UserError(f"{path}: not a plain file (a FIFO, a device or a folder); give the file itself")
    if st.st_size > limit:
        f.close()
        raise too_large(path, limit)
    return f


def read_capped(path: Path | str, limit: int) -> bytes:
    """The bytes of a file named by the user or found in a checked folder (a link followed), at most `limit`:
    a larger one is refused before it is read, a FIFO or a device without waiting on it (OSError as open() raises
    it)."""
    with _open_capped(path, limit) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise too_large(path, limit)
    return data


def capped_lines(path: Path | str, limit: int) -> Iterator[bytes]:
    """read_capped's file line by line (one line in memory at a time), refused past `limit` bytes: before the
    first line when its size says so, at the line that crosses it when it grew."""
    with _open_capped(path, limit) as f:
        left = limit
        for raw in f:
            left -= len(raw)
            if left < 0:
                raise too_large(path, limit)
            yield raw


def read_text(path: Path | str, limit: int, errors: str = "strict") -> str:
    """read_bytes as UTF-8 text (errors="strict": one line naming the first bad byte)."""
    data = read_bytes(path, limit)
    try:
        return data.decode("utf-8", errors)
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 (byte {e.start})") from None


def read_lines(path: Path | str, limit: int) -> Iterator[tuple[int, str]]:
    """(number, line) of one of a folder's UTF-8 text files, streamed: one line in memory at a time, the file
    refused past `limit` bytes (FileNotFoundError when it is missing, at the first line)."""
    with os.fdopen(_open_plain(path), "rb") as f:
        if os.fstat(f.fileno()).st_size > limit:
            raise too_large(path, limit)
        n, left = 0, limit
        for raw in f:
            n, left = n + 1, left - len(raw)
            if left < 0:
                raise too_large(path, limit)
            try:
                yield n, raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UserError(f"{path}:{n}: not UTF-8 (byte {e.start} of the line)") from None


def sha256_plain(path: Path | str, limit: int) -> str:
    """sha256 of one of a folder's files, refused when larger than `limit` bytes (FileNotFoundError: missing)."""
    h = hashlib.sha256()
    with os.fdopen(_open_plain(path), "rb") as f:
        if os.fstat(f.fileno()).st_size > limit:
            raise too_large(path, limit)
        n = 0
        while block := f.read(1 << 20):
            n += len(block)
            if n > limit:
                raise too_large(path, limit)
            h.update(block)
    return h.hexdigest()


def deep_message(where: str) -> str:
    return f"{where}: JSON nested deeper than {MAX_DEPTH} levels; this file was not written by bmoe-bench"


def loads(text: str | bytes, where: str) -> object:
    """One JSON value, its nesting bounded (UserError naming `where` when deeper than MAX_DEPTH); invalid JSON
    raises json.JSONDecodeError for the caller to treat as it treats a torn line."""
    try:
        obj = json.loads(text)
    except RecursionError:
        raise NotOurs(deep_message(where)) from None
    except json.JSONDecodeError:
        raise
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        raise UserError(f"{where}: not valid JSON ({shown(str(e), 100)})") from None
    if _depth(obj) > MAX_DEPTH:
        raise NotOurs(deep_message(where))
    return obj


def read_json(path: Path, limit: int) -> object:
    """The JSON value of one of a folder's files (FileNotFoundError when it is missing)."""
    data = read_bytes(path, limit)
    try:
        return loads(data.decode("utf-8"), str(path))
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None


def _depth(obj: object) -> int:
    """The nesting depth of a JSON value (a scalar: 0), without recursion."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        o, d = stack.pop()
        kids = o.values() if isinstance(o, dict) else o if isinstance(o, list) else None
        if kids is None:
            continue
        deepest = max(deepest, d)
        if d <= MAX_DEPTH:
            stack.extend((k, d + 1) for k in kids)
    return deepest
