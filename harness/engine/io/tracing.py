"""The recorders behind `--io-trace` and `--compute-trace` (the files: harness.formats.traces).

`Tracing` keeps the token clock (the session calls `decode_begin`/`decode_end` around every llama_decode: the
first call is the prompt's batch, phase 0 step 0, then steps 1..n) and holds the two recorders, either of
which may be absent:

- `IoTrace`: the hook calls `record(...)` when it issues a read (the read's metadata: token, layer, expert,
  tensor, offset, demand or speculative) and passes the returned id to the reader's `submit`; the reader calls
  `read_done(id, started, finished, bytes)` on its lane. `outcome(id, 'used'|'wasted')` settles a read later
  (a demand read is used from the start; a speculative one is `unknown` until told). `take()` hands out the
  settled rows, `take(final=True)` all of them.
- `ComputeTrace`: `wrap(callback)` times every Python callback (entry and exit); the hook reports its waits on
  reads (`wait(t0, t1)`) and the layer whose routing node it is in (`layer = il`); the gaps between callbacks
  are ggml computing.

Nothing here runs unless a trace was asked for: the hook and the reader test for None once per read or wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from harness.formats.traces import UNFILLED

_now = time.perf_counter_ns

# ReadRow's column order (harness.formats.traces), turn filled when taken
_LANE, _BYTES, _STARTED, _FINISHED, _OUTCOME = 8, 11, 13, 14, 15

# measured by microbenchmark on the 2-core development machine (2026-12-01): what each recorded event costs
PERTURBS_IO = ("yes, slightly: each traced read costs ~1.1 us of Python on the compute thread when issued and "
               "~0.6 us on its lane when done; rows are written between tokens (~0.5 us each, outside the decode "
               "call); the reads themselves are unchanged")
PERTURBS_COMPUTE = ("yes, slightly: every Python callback is timed at entry and exit (~0.6 us each; with the C "
                    "front a few callbacks per layer, with the Python front or during the dense-weights scan of "
                    "the first graphs one per graph node); intervals are written between tokens")


class IoTrace:
    def __init__(self, clock: Tracing):
        self.clock = clock
        self._rows: dict[int, list] = {}
        self._next = 0
        self._lanes: dict[int, int] = {}
        self._lock = threading.Lock()

    def record(self, layer: int, expert: int, tensor: str, offset: int, length: int, kind: str = "demand") -> int:
        rid = self._next
        self._next += 1
        c = self.clock
        self._rows[rid] = [rid, 0, c.phase, c.step, layer, expert, tensor, kind, UNFILLED, offset, length, UNFILLED,
                           _now(), UNFILLED, UNFILLED, "used" if kind == "demand" else "unknown"]
        return rid

    def _lane(self) -> int:
        me = threading.get_ident()
        lane = self._lanes.get(me)
        if lane is None:
            with self._lock:
                lane = self._lanes.setdefault(me, len(self._lanes))
        return lane

    def read_done(self, rid: int, started_ns: int, finished_ns: int, nbytes: int, lane: int | None = None) -> None:
        """On the reader's lane, when the read has landed (`lane` None), or later with the lane's number (the
        compiled lanes report when the read is collected)."""
        r = self._rows.get(rid)
        if r is not None:
            r[_LANE], r[_STARTED], r[_FINISHED], r[_BYTES] = (self._lane() if lane is None else lane, started_ns,
                                                              finished_ns, nbytes)

    def forget(self, rid: int) -> None:
        """A read withdrawn before it started (a cancelled prefetch): it never happened, so no row."""
        self._rows.pop(rid, None)

    def outcome(self, rid: int, what: str) -> None:
        r = self._rows.get(rid)
        if r is not None:
            r[_OUTCOME] = what

    def take(self, turn: int = 0, final: bool = False) -> list[tuple]:
        """Rows whose read has finished and whose outcome is known (final: every row), in id order."""
        out = []
        for rid in sorted(self._rows):
            r = self._rows[rid]
            if final or (r[_FINISHED] != UNFILLED and r[_OUTCOME] != "unknown"):
                del self._rows[rid]
                r[1] = turn
                out.append(tuple(r))
        return out


class ComputeTrace:
    def __init__(self, clock: Tracing):
        self.clock = clock
        self.layer = -1
        self._out: list[list] = []
        self._mark = 0  # the last callback's exit (or the decode call)
        self._cursor = 0  # inside a callback: where its hook time resumes

    def _add(self, state: str, a: int, b: int) -> None:
        c, out = self.clock, self._out
        last = out[-1] if out else None
        if last is not None and last[4] == state and last[3] == self.layer and last[6] == a and last[2] == c.step:
            last[6] = b  # contiguous with the previous interval of the same kind: extend it
        else:
            out.append([0, c.phase, c.step, self.layer, state, a, b])

    def begin(self, t: int) -> None:
        self.layer = -1
        self._mark = t

    def end(self, t: int) -> None:
        self._add("compute", self._mark, t)

    def wrap(self, cb: Callable[[int, bool, object], bool]) -> Callable[[int, bool, object], bool]:
        def traced(t: int, ask: bool, ud: object) -> bool:
            t0 = _now()
            self._add("compute", self._mark, t0)
            self._cursor = t0
            try:
                return cb(t, ask, ud)
            finally:
                t1 = _now()
                self._add("hook", self._cursor, t1)
                self._mark = t1
        return traced

    def wait(self, t0: int, t1: int) -> None:
        """The hook blocked on reads from t0 to t1 (inside the current callback)."""
        self._add("hook", self._cursor, t0)
        self._add("wait", t0, t1)
        self._cursor = t1

    def take(self, turn: int = 0) -> list[tuple]:
        out, self._out = self._out, []
        for r in out:
            r[0] = turn
        return [tuple(r) for r in out]


class Tracing:
    """The token clock and the recorders a run asked for."""

    def __init__(self, io: bool, compute: bool):
        self.phase, self.step = 0, 0
        self._calls = 0
        self.io = IoTrace(self) if io else None
        self.compute = ComputeTrace(self) if compute else None

    def decode_begin(self) -> None:
        self.step = self._calls
        self.phase = 0 if self._calls == 0 else 1
        self._calls += 1
        if self.compute is not None:
            self.compute.begin(_now())

    def decode_end(self) -> None:
        if self.compute is not None:
            self.compute.end(_now())
