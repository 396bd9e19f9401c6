"""Where the hook's `mgmt_ms` goes: runs `bmoe` in this process with the hook's pieces timed (wall and the
compute thread's own CPU time), and prints one line per piece, per decode token.

    python -m harness.engine.diag.mgmt_profile OUT.json -- -m model.gguf --moe-stream --cache-mb 80 -t 1 -n 16 ...

Each timed piece is a StreamHook or ExpertCache method; the numbers are inclusive (a piece's time contains the
pieces it calls) and are summed over the decode tokens (the first token, the prompt's batch, is left out).
`wall - cpu` of a piece is time the compute thread was off the CPU inside it: runnable and waiting for a core
(the kernel's run delay, /proc/thread-self/schedstat, shown for the pieces mgmt_ns counts) or blocked (on the GIL,
held by a lane thread completing a read's future, or on a lock). The wrappers add a few µs per call, counted in.
A measurement tool for the lead and for engineers: nothing in the engine imports it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

_wall: dict[str, int] = defaultdict(int)
_cpu: dict[str, int] = defaultdict(int)
_calls: dict[str, int] = defaultdict(int)
_on = [False]  # counting only in decode tokens


_runq: dict[str, int] = defaultdict(int)
_fds: dict[int, int] = {}


def _run_delay() -> int:
    """This thread's time spent runnable but waiting for a core (/proc/thread-self/schedstat, field 2)."""
    me = threading.get_ident()
    fd = _fds.get(me)
    if fd is None:
        fd = _fds[me] = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
    return int(os.pread(fd, 100, 0).split()[1])


def _timed(name: str, fn: Callable[..., Any], runq: bool = False) -> Callable[..., Any]:
    pc, tt = time.perf_counter_ns, time.thread_time_ns

    def wrapper(*a: Any, **k: Any) -> Any:
        if not _on[0]:
            return fn(*a, **k)
        q0 = _run_delay() if runq else 0
        w0, c0 = pc(), tt()
        try:
            return fn(*a, **k)
        finally:
            _wall[name] += pc() - w0
            _cpu[name] += tt() - c0
            _calls[name] += 1
            if runq:
                _runq[name] += _run_delay() - q0

    return wrapper


def install() -> None:
    from harness.engine.cache.expert_cache import expert_cache as cache
    from harness.engine.cache.expert_cache import prefetch
    from harness.engine.io import clanes, reader
    from harness.engine.stream import hook

    H = hook.StreamHook
    top = ("_on_topk", "_bind", "_evict_now", "_finish_weights", "_run_taps", "_scan_dense")  # what mgmt_ns counts
    for m in (*top, "_account", "_submit", "_submit_many", "_submit_layer", "_drop", "_wait"):
        if hasattr(H, m):
            setattr(H, m, _timed(m, getattr(H, m), runq=m in top))
    for m in ("lookup_batch", "evict_over_budget"):
        setattr(cache.ExpertCache, m, _timed("cache." + m, getattr(cache.ExpertCache, m)))
    for m in ("on_routed", "admit", "on_evicted"):
        setattr(prefetch.Prefetcher, m, _timed("prefetch." + m, getattr(prefetch.Prefetcher, m)))
    for m in ("submit", "submit_speculative", "submit_many", "submit_layer", "submit_registered"):
        if hasattr(reader.SliceReader, m):
            setattr(reader.SliceReader, m, _timed("reader." + m, getattr(reader.SliceReader, m)))
    for m in ("submit_groups", "submit_layer"):  # the compiled lanes' calls, their ctypes arrays and futures
        if hasattr(clanes.CLanes, m):
            setattr(clanes.CLanes, m, _timed("clanes." + m, getattr(clanes.CLanes, m)))
    take = H.take_counters
    state = {"tokens": 0, "mgmt_ns": 0, "token_ns": 0, "last": 0}

    def take_counters(self: Any) -> Any:
        was = _on[0]
        c = take(self)
        t = time.perf_counter_ns()
        if was:
            state["tokens"] += 1
            state["mgmt_ns"] += c.mgmt_ns
            state["token_ns"] += t - state["last"]  # from the last token's end: this token's whole wall time
        state["last"] = t
        _on[0] = True  # from the second token on (the first is the prompt's batch)
        return c

    H.take_counters = take_counters  # type: ignore[method-assign]
    _STATE.update(state=state)


_STATE: dict[str, Any] = {}


def report() -> dict[str, Any]:
    st = _STATE["state"]
    n = max(1, st["tokens"])
    rows = {k: {"wall_ms": _wall[k] / n / 1e6, "cpu_ms": _cpu[k] / n / 1e6, "calls": _calls[k] / n,
                "runq_ms": _runq[k] / n / 1e6 if k in _runq else None}
            for k in sorted(_wall, key=lambda k: -_wall[k])}
    return {"decode_tokens": st["tokens"], "mgmt_ms_per_token": st["mgmt_ns"] / n / 1e6,
            "s_per_token": st["token_ns"] / n / 1e9, "mgmt_share": st["mgmt_ns"] / max(1, st["token_ns"]),
            "pieces": rows}


def main() -> int:
    out, argv = sys.argv[1], sys.argv[sys.argv.index("--") + 1:]
    from harness.engine import cli

    cli._reexec_with_shim(argv)
    install()
    rc = cli.run(argv)
    r = report()
    r["argv"] = argv
    with open(out, "w") as f:
        json.dump(r, f, indent=1)
    print(f"mgmt {r['mgmt_ms_per_token']:.2f} ms/token over {r['decode_tokens']} decode tokens of "
          f"{r['s_per_token'] * 1e3:.0f} ms: {100 * r['mgmt_share']:.1f}%", file=sys.stderr)
    for k, v in r["pieces"].items():
        q = v["runq_ms"]
        rq = f"  (waiting for a core {q:6.2f}, blocked {v['wall_ms'] - v['cpu_ms'] - q:6.2f})" if q is not None else ""
        print(f"  {k:28s} wall {v['wall_ms']:8.2f}  cpu {v['cpu_ms']:8.2f}  off-cpu {v['wall_ms'] - v['cpu_ms']:7.2f}"
              f"  calls {v['calls']:7.1f}{rq}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
