"""Loading a model without reading all of it: the optional mmap shim (lazymap.c) and how the engine uses it.

llama.cpp (at the pinned llama-cpp-python 0.3.36) maps every model file with MAP_POPULATE and then advises
WILLNEED over the whole mapping whenever the architecture marks no tensor for lazy reading (qwen3moe,
gpt-oss and the other MoE archs mark none), and no model parameter or environment variable turns that off:
`llama_model_load_from_file` reads every byte of the file before it returns. The shim, preloaded with
LD_PRELOAD, clears MAP_POPULATE and drops that advice for the files named in `BMOE_LAZY_MAP` only; pages
are then read when first touched (the dense weights during the first decode; routed experts never, when
streamed, since the hook rebinds them before they are computed).

LD_PRELOAD only works from the start of a process, so the `bmoe` command re-executes itself once with it
(`reexec_env`); in-process users of the engine load as llama.cpp does. Where the shim was not built, the
engine says so and loads as llama.cpp does: a difference of speed and of bytes read, never of output.
"""

from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

FILES_ENV = "BMOE_LAZY_MAP"  # "dev:ino[,dev:ino...]" of the files to map without populating (read by the shim)
GUARD_ENV = "BMOE_LAZY_MAP_REEXEC"  # set across the one re-exec: LD_PRELOAD's value before it ("" if unset)


def shim_path() -> str | None:
    """The built shim (harness/engine/_lazymap*.so), or None when it was not built."""
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "_lazymap*.so")))
    return found[0] if found else None


def _mapped(path: str) -> bool:
    try:
        with open("/proc/self/maps") as f:
            return any(line.rstrip().endswith(path) for line in f)
    except OSError:
        return False


def preloaded() -> bool:
    """Is the shim in this process? Only LD_PRELOAD puts it there (`stats` opens it only once it is), and
    a preloaded library comes before libc, so its mmap is the one llama.cpp calls."""
    p = shim_path()
    return bool(p) and _mapped(p)


def reexec_env(environ: Mapping[str, str]) -> dict[str, str] | None:
    """The environment to re-execute `bmoe` with so that the shim is preloaded, or None when it must not
    (shim not built, already preloaded, already re-executed once, or a path LD_PRELOAD cannot hold)."""
    p = shim_path()
    if not p or GUARD_ENV in environ or " " in p or ":" in p:
        return None
    old = environ.get("LD_PRELOAD", "")
    if p in old.replace(":", " ").split():
        return None
    env = dict(environ)
    env[GUARD_ENV] = old
    env["LD_PRELOAD"] = f"{p} {old}".strip()
    return env


def restore_preload_env() -> None:
    """After the re-exec: give children the LD_PRELOAD this process was started with (the shim is already
    loaded here; children need not carry it)."""
    if GUARD_ENV in os.environ:
        old = os.environ[GUARD_ENV]
        if old:
            os.environ["LD_PRELOAD"] = old
        else:
            os.environ.pop("LD_PRELOAD", None)


def file_ids(paths: list[Path]) -> str:
    out = []
    for p in paths:
        st = os.stat(p)
        out.append(f"{st.st_dev}:{st.st_ino}")
    return ",".join(out)


def stats() -> tuple[int, int] | None:
    """(mappings made without MAP_POPULATE, WILLNEED advice dropped) so far, or None without the shim."""
    p = shim_path()
    if not p or not preloaded():
        return None
    lib = ctypes.CDLL(p)  # the preloaded copy: same file, same handle
    maps, skipped = ctypes.c_long(), ctypes.c_long()
    lib.bmoe_lazymap_stats(ctypes.byref(maps), ctypes.byref(skipped))
    return maps.value, skipped.value


def wants_populate(load_populate: str, streamed: bool) -> bool:
    """`--load-populate auto|on|off`: auto keeps llama.cpp's populating load for the plain mmap run (the
    baseline stays llama.cpp's own), and drops it when experts are streamed (they never go through the
    mapping, so reading them at load is pure waste)."""
    return load_populate == "on" or (load_populate == "auto" and not streamed)


@dataclass(frozen=True)
class LoadMode:
    """How the model was mapped, for the CSV: `populate` is what happened, `note` why."""

    populate: bool
    note: str


@contextmanager
def unpopulated(paths: list[Path], want_populate: bool) -> Iterator[list[LoadMode]]:
    """Around the llama.cpp load: name the model files to the shim (when wanted and present), and report
    what happened (the yielded list receives one LoadMode when the block ends)."""
    out: list[LoadMode] = []
    if want_populate:
        yield out
        out.append(LoadMode(True, "--load-populate (on, or auto without --moe-stream): llama.cpp's MAP_POPULATE"))
        return
    if shim_path() is None:
        yield out
        out.append(LoadMode(True, "mmap shim not built (harness/engine/_lazymap*.so): llama.cpp's MAP_POPULATE"))
        return
    before = stats()
    if before is None:
        yield out
        out.append(LoadMode(True, "mmap shim not preloaded (engine run in-process, not by the bmoe command): "
                                  "llama.cpp's MAP_POPULATE"))
        return
    os.environ[FILES_ENV] = file_ids(paths)
    try:
        yield out
    finally:
        os.environ.pop(FILES_ENV, None)
    after = stats() or before
    maps = after[0] - before[0]
    if maps >= len(paths):
        out.append(LoadMode(False, f"mmap shim: {maps} file mapping(s) without MAP_POPULATE, "
                                   f"{after[1] - before[1]} WILLNEED advice dropped"))
    else:
        out.append(LoadMode(True, f"mmap shim acted on {maps} of {len(paths)} model file(s)"))
