"""How busy the machine is now, for the tests whose bound is wall time (a product's "within 2 s")."""

from __future__ import annotations

import subprocess
import sys


def slowdown() -> float:
    """How much slower than its CPU time a process of this priority runs here now (1 on an idle machine): a
    loaded machine cannot give the 2 s a command is allowed in 2 s of wall time, so such a bound scales by it."""
    p = subprocess.run([sys.executable, "-c", "import time\nw, c = time.monotonic(), time.process_time()\n"
                        "while time.process_time() - c < 0.1: pass\n"
                        "print((time.monotonic() - w) / (time.process_time() - c))"],
                       capture_output=True, text=True, timeout=300)
    return max(1.0, float(p.stdout))
