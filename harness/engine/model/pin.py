"""The llama-cpp-python version bmoe is built against. pyproject.toml pins it (the ctypes mirror of
`struct ggml_tensor` and the eval-callback contract follow its vendored llama.cpp); this reads that pin back
from the installed distribution's metadata rather than repeating it."""

from __future__ import annotations

import re
from importlib import metadata

DISTRIBUTION = "bmoe"


def pinned_version(requires: list[str] | None = None) -> str | None:
    """The exact version `bmoe` requires of llama-cpp-python (`==X` in its metadata), or None when bmoe is
    not installed as a distribution or does not pin it exactly. requires: the requirement lines to read
    instead of the installed metadata (tests)."""
    if requires is None:
        try:
            requires = metadata.requires(DISTRIBUTION) or []
        except metadata.PackageNotFoundError:
            return None
    for req in requires:
        m = re.fullmatch(r"llama[-_.]cpp[-_.]python\s*==\s*([^\s;,]+)\s*(;.*)?", req.strip(), flags=re.IGNORECASE)
        if m:
            return m.group(1)
    return None
