"""The C twins, built by setup.py with one compiler profile (`COMPILE_ARGS` in setup.py), each with its Python fallback:

| C source | built as | Python wrapper | fallback when not built |
|---|---|---|---|
| cfilter.c | _cfilter (ctypes) | stream/front.py | the pure-Python eval callback |
| clanes.c, clanes_groups.c | _clanes (ctypes) | io/clanes.py | io/lanes.py (Python threads) |
| clanes_pool.c, clanes_move.c | in _clanes | io/recycle.py | io/recycle.py, io/recycle_move.py (Python lanes) |
| lazymap.c | _lazymap (LD_PRELOAD) | io/lazymap.py | llama.cpp's populating load |
| policyc*.c | _policyc (extension) | cache/policies/native.py | the policies' numpy code |

May import: nothing of the engine (this package only finds the built libraries).
"""

from __future__ import annotations

import glob
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def library(stem: str) -> str | None:
    """The built shared object `_<stem>*.so` beside this file, or None when it was not built."""
    found = sorted(glob.glob(os.path.join(HERE, f"_{stem}*.so")))
    return found[0] if found else None
