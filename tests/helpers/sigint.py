"""Ctrl-C at a set time into a test, through the handler every bmoe-bench command installs (harness.interrupts).

A bare SIGINT raises KeyboardInterrupt wherever the main thread is; on a busy machine that can be inside
`subprocess.Popen`'s fork, where CPython swallows it and the run goes on to its timeout (CI saw "DID NOT RAISE"
twice). The commands install harness.interrupts, which records it there and raises it at the wait loop's next
check; so do these tests."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

from harness import interrupts


@contextlib.contextmanager
def sigint_after(seconds: float) -> Iterator[None]:
    restore = interrupts.install()
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        restore()
