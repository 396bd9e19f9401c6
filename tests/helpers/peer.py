"""The C++ original's engine (`bmoe-cli`), when scripts/build-peer.sh has built it: where it is, and a skip
with the reason when it is not there (the product never needs it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PEER_FLAGS = "-DGGML_LLAMAFILE=OFF"  # scripts/build-peer.sh builds the peer's llama.cpp as setup.sh builds bmoe's


def peer_path() -> Path:
    """Where scripts/build-peer.sh puts the binary ($BMOE_PEER_DIR, default ~/.cache/bmoe/peer)."""
    d = os.environ.get("BMOE_PEER_DIR") or str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                                               / "bmoe" / "peer")
    return Path(d) / "bmoe-cli"


def peer_cli() -> Path:
    """The built bmoe-cli, or skip the test saying how to build it."""
    p = peer_path()
    if not (p.is_file() and os.access(p, os.X_OK)):
        pytest.skip(f"the C++ peer is not built at {p}: run scripts/build-peer.sh (needs ../shared next to the "
                    f"repository)")
    stamp = p.parent / "build-flags"
    if not stamp.is_file() or PEER_FLAGS not in stamp.read_text():
        pytest.skip(f"the C++ peer at {p} was built before {PEER_FLAGS} (its prefill rounds differently from "
                    f"bmoe's llama.cpp): run scripts/build-peer.sh to rebuild it")
    return p
