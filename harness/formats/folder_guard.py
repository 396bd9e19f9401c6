"""A campaign folder is untrusted input: reviewers audit folders other people committed. What every command
checks when it opens one, before it reads a file of the folder or writes one into it:

- `refuse_links(folder)`: nothing inside is a symbolic link or a special file (FIFO, socket, device), and
  nothing is nested deeper than bmoe-bench ever writes. A link would make a write, a delete or a hash land
  outside the folder; a FIFO would hang a read. One line naming them.
- `inside(folder, path)`: a path built from a value the folder holds (a run id) resolves inside the folder.
- `read_json(path, limit)`: one of the folder's JSON files, opened without following a link, refused as
  one line naming it when larger than `limit` bytes, nested deeper than `MAX_DEPTH`, or not UTF-8 JSON.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

from harness.errors import UserError

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


def read_json(path: Path, limit: int) -> object:
    """The JSON value of one of a folder's files (FileNotFoundError when it is missing)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as e:
        why = "a symbolic link" if e.errno == errno.ELOOP else e.strerror
        raise UserError(f"{path}: cannot be read ({why}); restore the file bmoe-bench wrote") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{path}: not a plain file; restore the file bmoe-bench wrote")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UserError(f"{path}: larger than {limit // 2**20} MiB, far beyond any file bmoe-bench writes; "
                        f"this file was not written by bmoe-bench")
    try:
        obj = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:
        raise UserError(f"{path}: JSON nested deeper than {MAX_DEPTH} levels; this file was not written by "
                        f"bmoe-bench") from None
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        raise UserError(f"{path}: not valid JSON ({shown(str(e), 100)})") from None
    if _depth(obj) > MAX_DEPTH:
        raise UserError(f"{path}: JSON nested deeper than {MAX_DEPTH} levels; this file was not written by "
                        f"bmoe-bench")
    return obj


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
