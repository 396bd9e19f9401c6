"""Writing a stored file so that a reader never sees half of it, and the hash that proves it unchanged.

`atomic_write_*` write a sibling `.NAME.tmp`, fsync it and rename it over the target: after a crash the
file is either the old one or the new one. `sha256_file` is the digest the manifest records for every raw
file of a committed run."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_text(path: Path | str, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path | str, obj: object) -> None:
    """One-space indented JSON with a final newline, keys in the order given."""
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=False) + "\n")


def sha256_file(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
