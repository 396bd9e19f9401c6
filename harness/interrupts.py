"""A stop request (SIGTERM or Ctrl-C) that cannot be lost.

A signal handler that raises KeyboardInterrupt raises it once, wherever the main thread is. When that is a
callback whose exceptions CPython prints and ignores, the interrupt is gone: measured on this runner, a
SIGTERM that lands while `subprocess.Popen` forks the engine is raised inside logging's at-fork hook
(`_releaseLock`), printed as "Exception ignored", and the runner then waits for the engine forever (2 of 5
tries in a stress loop). So the handler records the request, and raises at once unless the main thread is
inside `Popen` starting a process (where it would be swallowed, or leave a half-started child); every loop
that waits on a run calls `check()`, which raises it there, a fraction of a second later.

Stays at the root because devices/, targets/ and campaigns/ all call `check()` while they wait, below each of them."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

_pending = False


def _starting_a_process(frame: FrameType | None) -> bool:
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_execute_child" and code.co_filename.endswith("subprocess.py"):
            return True
        frame = frame.f_back
    return False


def _handler(signum: int, frame: FrameType | None) -> None:
    global _pending
    _pending = True
    if not _starting_a_process(frame):
        raise KeyboardInterrupt


def install() -> Callable[[], None]:
    """Route SIGTERM and SIGINT through the recording handler; return what puts the old handlers back."""
    global _pending
    _pending = False
    old = {s: signal.signal(s, _handler) for s in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        global _pending
        _pending = False
        for s, h in old.items():
            signal.signal(s, h)
    return restore


def handled() -> None:
    """The interrupt reached the code that stops the campaign: nothing is pending any more."""
    global _pending
    _pending = False


def check() -> None:
    """In the main thread, raise KeyboardInterrupt if a stop was requested and not yet handled."""
    global _pending
    if _pending and threading.current_thread() is threading.main_thread():
        _pending = False
        raise KeyboardInterrupt
