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
import os
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness.engine import native

FILES_ENV = "BMOE_LAZY_MAP"  # "dev:ino[,dev:ino...]" of the files to map without populating (read by the shim)
GUARD_ENV = "BMOE_LAZY_MAP_REEXEC"  # set across the one re-exec: LD_PRELOAD's value before it ("" if unset)


def shim_path() -> str | None:
    """The built shim (harness/engine/native/_lazymap*.so), or None when it was not built."""
    return native.library("lazymap")


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


def restore_preload_env(environ: MutableMapping[str, str]) -> None:
    """After the re-exec: give children the LD_PRELOAD this process was started with (the shim is already
    loaded here; children need not carry it). `environ`: the process's environment, given by the CLI."""
    if GUARD_ENV in environ:
        old = environ[GUARD_ENV]
        if old:
            environ["LD_PRELOAD"] = old
        else:
            environ.pop("LD_PRELOAD", None)


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
        out.append(LoadMode(True, "mmap shim not built (harness/engine/native/_lazymap*.so): llama.cpp's MAP_POPULATE"))
        return
    before = stats()
    if before is None:
        yield out
        out.append(LoadMode(True, "mmap shim not preloaded (engine run in-process, not by the bmoe command): "
                                  "llama.cpp's MAP_POPULATE"))
        return
    os.environ[FILES_ENV] = file_ids(paths)  # written for the shim, which reads it during the load (no setting)
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


# ---- a model file changed under the running engine -------------------------------------------------------------

EXIT_MODEL_CHANGED = 4  # the exit status when a model file changed or failed under the running engine
_WATCH: list[object] = []  # what must stay alive for the life of the process (fds, names, the thread)


_DEFER: list[tuple[Callable[[str], None], float]] = []


def defer_changes(handler: Callable[[str], None], grace_s: float) -> None:
    """The pure-Python watcher (below), on a change, calls handler(why) from its thread and gives it grace_s
    seconds before it exits (the compiled handler's equivalent: serve.process.defer_model_faults)."""
    _DEFER[:] = [(handler, grace_s)]


def watch_model_files(paths: list[Path], code: int = EXIT_MODEL_CHANGED, *, compiled: bool = True) -> str:
    """Make a model file truncated or replaced under the running engine one line on stderr and exit status
    `code`, instead of a silent SIGBUS (exit 135) when the engine touches its mapping past the new end.
    With the compiled helper, its SIGBUS handler does it; without it (or `compiled=False`), a thread that
    checks the files' sizes every 50 ms and wakes on a SIGBUS through Python's signal wakeup fd (from the
    main thread only; it cannot help a fault taken while holding the GIL). Returns which."""
    fds = [os.open(p, os.O_RDONLY | os.O_CLOEXEC) for p in paths]
    sizes = [os.fstat(fd).st_size for fd in fds]
    names = [str(p).encode() for p in paths]
    _WATCH.extend([fds, names])
    so = shim_path() if compiled else None
    if so is not None:
        try:
            lib = ctypes.CDLL(so)
            install = lib.bmoe_sigbus_install
        except (OSError, AttributeError):  # an older build without the handler
            install = None
        if install is not None:
            n = len(fds)
            c_fds = (ctypes.c_int * n)(*fds)
            c_sizes = (ctypes.c_longlong * n)(*sizes)
            c_names = (ctypes.c_char_p * n)(*names)
            _WATCH.extend([lib, c_fds, c_sizes, c_names])
            if install(n, c_fds, c_sizes, c_names, code) == 0:
                return "SIGBUS handler (compiled helper)"
    import select
    import signal
    import threading

    wake = -1
    if threading.current_thread() is threading.main_thread():
        # Python's own C handler returns from a SIGBUS (the faulting thread then faults again, its GIL
        # released inside llama.cpp) and writes the signal number to the wakeup fd: this thread reads it
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.signal(signal.SIGBUS, lambda signum, frame: None)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        wake = r
        _WATCH.extend([r, w])

    def say(why: str) -> None:
        if _DEFER:  # a server answers its request in flight first (defer_changes), then exits
            handler, grace_s = _DEFER[0]
            handler(why)
            time.sleep(grace_s)
        os.write(2, f"bmoe: error: {why}; do not change a model file while it runs: restore it and run "
                    f"again\n".encode())
        os._exit(code)

    def changed() -> str | None:
        for p, fd, size in zip(paths, fds, sizes, strict=True):
            now = os.fstat(fd).st_size
            if now != size:
                return f"{p} changed size under the running engine ({size} bytes at load, {now} now)"
        return None

    def poll() -> None:
        while True:
            ready = select.select([wake], [], [], 0.05)[0] if wake >= 0 else time.sleep(0.05)
            why = changed()
            if why is not None:
                say(why)
            if ready and signal.SIGBUS in os.read(wake, 4096):
                say("a read through the model's file mapping failed (SIGBUS: the file was truncated, replaced "
                    "or its storage failed)")

    t = threading.Thread(target=poll, name="bmoe-model-watch", daemon=True)
    t.start()
    _WATCH.append(t)
    return "SIGBUS wakeup and size check (pure Python)" if wake >= 0 else "size check every 50 ms"
