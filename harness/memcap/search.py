"""The smallest memory cap at which a command runs: the criterion for one run, and the bisection over caps.

Pure: a probe (one or more real capped runs at a cap, harness.memcap.probe) comes in as a callable, so every branch
runs in a test without a cgroup.

The criterion (`Criterion.verdict`): a run at a cap *runs* when it exits 0, the kernel's OOM killer killed nothing in
its cgroup, it ended inside its timeout, its metrics CSV holds the tokens asked, and its decode speed is at least
1/`slowdown` of the roomy run's (the same command under a cap it does not feel). The speed floor is there because a
run short of memory need not die: without swap the kernel takes back file pages instead (the interpreter's and the
libraries' code, the dense weights when they are a file mapping), the run faults them in again every token, goes 5-10x
slower and still exits 0 (the dense-mmap cells of bench-data/2026-12-03-peer-cxx-precision: 0.20x). 2x is the
default floor: a roomy run of the 1.1 GiB model on this shared machine varies by 13-25% (coefficient of variation),
so a healthy run stays above half its roomy speed by several standard deviations, and a thrashing one falls below it.

The search: caps are multiples of the resolution; the bracket [lo, hi] must fail at lo and run at hi (both checked),
then it is halved until hi - lo is one resolution step. The answer is hi, the smallest cap seen to run with lo one
step below seen to fail. A run near the edge can run once and fail the next time (reclaim races the allocations),
so a probe may run a cap several times and count it as running only if every repeat ran.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RunFacts:
    """What one capped run showed (harness.memcap.probe fills it in)."""

    exit_code: int | None  # None when killed by a signal or the timeout
    oom_kills: int  # the cgroup's oom_kill count
    timed_out: bool
    tokens: int  # token rows in its metrics CSV (0 when there is none)
    tok_s: float | None  # decode tokens per second (kept tokens / their summed wall time), None when unmeasured


@dataclass(frozen=True)
class Criterion:
    """When a capped run counts as running (see the module's docstring)."""

    tokens: int  # the tokens asked (-n)
    roomy_tok_s: float | None = None  # None: no speed floor (the roomy run itself)
    slowdown: float = 2.0

    def verdict(self, r: RunFacts) -> str | None:
        """None when the run ran; else why not, in a few words."""
        if r.oom_kills:
            return f"OOM-killed ({r.oom_kills})"
        if r.timed_out:
            return "timed out"
        if r.exit_code != 0:
            return f"exit {r.exit_code}" if r.exit_code is not None else "killed by a signal"
        if r.tokens < self.tokens:
            return f"{r.tokens} of {self.tokens} tokens"
        if self.roomy_tok_s is not None:
            if r.tok_s is None:
                return "no decode speed measured"
            floor = self.roomy_tok_s / self.slowdown
            if r.tok_s < floor:
                return f"{r.tok_s:.2f} tok/s, under 1/{self.slowdown:g} of the roomy {self.roomy_tok_s:.2f}"
        return None


@dataclass
class Search:
    """The bisection's state and what it saw: `runs[cap]` is True when the cap ran."""

    resolution: int
    runs: dict[int, bool] = field(default_factory=dict)
    min_cap: int | None = None  # the smallest cap seen to run, with min_cap - resolution seen to fail
    note: str = ""


def snap_down(cap: int, resolution: int) -> int:
    return cap // resolution * resolution


def snap_up(cap: int, resolution: int) -> int:
    return -(-cap // resolution) * resolution


def bisect(probe: Callable[[int], bool], lo: int, hi: int, resolution: int) -> Search:
    """The smallest cap in [lo, hi] (snapped to multiples of `resolution`) at which `probe(cap)` is True, assuming
    it is False below some cap and True from it on. lo is probed and must fail, hi must run; when either does not,
    the search stops and says so in `note` (min_cap stays None, or is lo when even lo ran)."""
    if resolution <= 0:
        raise ValueError(f"resolution {resolution} MiB is not positive")
    lo, hi = snap_down(lo, resolution), snap_up(hi, resolution)
    if lo <= 0:
        lo = resolution
    if hi <= lo:
        raise ValueError(f"the bracket [{lo}, {hi}] MiB is empty at a resolution of {resolution} MiB")
    s = Search(resolution)

    def ask(cap: int) -> bool:
        s.runs[cap] = probe(cap)
        return s.runs[cap]

    if not ask(hi):
        s.note = f"does not run even at {hi} MiB: raise the upper end of the bracket"
        return s
    if ask(lo):
        s.min_cap = lo
        s.note = f"runs already at {lo} MiB, the lower end of the bracket: lower it to find the edge"
        return s
    while hi - lo > resolution:
        mid = lo + (hi - lo) // resolution // 2 * resolution
        if ask(mid):
            hi = mid
        else:
            lo = mid
    s.min_cap = hi
    s.note = f"runs at {hi} MiB, fails at {lo} MiB"
    return s
