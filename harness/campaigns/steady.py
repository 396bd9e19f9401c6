"""Holding a device steady between runs (pure policy; the clock and the sleep are injected):

- `Pacer`: the fixed cool-down of `cooldown.between_runs_s`, one per device: nothing before the first run of a
  session, then the whole wait before every run that follows one that started an engine. It sleeps in short
  steps, reporting each to `on_wait` (the progress line; on a fleet it raises KeyboardInterrupt once the campaign
  is stopped) and checking for Ctrl-C (harness.interrupts), so a stop never waits for the end of the cool-down.
- `deferral`: with `cooldown.on_timeout: defer`, a gate that gave up gives the record of a deferral (the run is
  not started) instead of a run started hot.
- `DeferBudget` and `DeferQueue`: a deferred run goes to the end of the queue, at most `max_deferrals` times in
  one session; after that it is left unrun (still pending, its deferrals recorded), and `run` again retries it.
- `left_unrun`: the status line of a session that left deferred runs."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable

from harness import interrupts
from harness.campaigns.gate import GateResult
from harness.formats.campaign import Cooldown
from harness.formats.manifest import RunRecord
from harness.formats.outcome import Deferral

STEP_S = 0.25  # the longest sleep between two checks for a stop during the cool-down


class Pacer:
    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, step_s: float = STEP_S):
        self.seconds = seconds
        self.clock, self.sleep, self.step_s = clock, sleep, step_s
        self._ran = False

    def ran(self) -> None:
        """An engine ran on this device: the next run waits first."""
        self._ran = True

    def rest(self, on_wait: Callable[[str], None] | None = None) -> float | None:
        """The fixed cool-down before a run: the seconds waited (0 before a session's first run), or None when
        the campaign asks for none."""
        if self.seconds <= 0:
            return None
        if not self._ran:
            return 0.0
        t0 = self.clock()
        while (done := self.clock() - t0) < self.seconds:
            if on_wait is not None:
                on_wait(f"between runs {done:.0f}/{self.seconds:g} s")
            interrupts.check()
            self.sleep(min(self.step_s, self.seconds - done))
        self._ran = False
        return round(self.clock() - t0, 2)


def deferral(gate: GateResult, cd: Cooldown, at: str, rested_s: float | None) -> Deferral | None:
    """The run's deferral when the gate gave up and the campaign never runs hot; None: the run goes ahead."""
    if not gate.gave_up or cd.on_timeout != "defer":
        return None
    return Deferral(at=at, waited_s=round(gate.waited_s, 2), reason=gate.reason or "the gate gave up",
                    cpu_temp_c=gate.entry.get("cpu_temp_c"), **({"rested_s": rested_s} if rested_s is not None else {}))


class DeferBudget:
    """How many times each run was deferred in this session, against `max_deferrals`."""

    def __init__(self, max_deferrals: int):
        self.max = max_deferrals
        self.count: dict[int, int] = {}

    def again(self, i: int) -> bool:
        """Run i was deferred once more: may it go to the end of the queue (else it is left unrun)?"""
        self.count[i] = self.count.get(i, 0) + 1
        return self.count[i] <= self.max


class DeferQueue:
    """A session's pending runs (indices) in order; a deferred run goes to the end while its budget lasts."""

    def __init__(self, pending: Iterable[int], max_deferrals: int):
        self.q: deque[int] = deque(pending)
        self.budget = DeferBudget(max_deferrals)
        self.left: list[int] = []  # deferred past the budget: not run in this session

    def take(self) -> int | None:
        return self.q.popleft() if self.q else None

    def defer(self, i: int) -> bool:
        """Run i was deferred: True when it goes to the end of the queue, False when it is left unrun."""
        if self.budget.again(i):
            self.q.append(i)
            return True
        self.left.append(i)
        return False


def left_unrun(runs: Iterable[RunRecord]) -> str | None:
    """The manifest status of a session that left deferred runs unrun, or None when it left none."""
    hot = [r for r in runs if r.deferred]
    if not hot:
        return None
    last = hot[-1].deferrals[-1].reason
    return (f"incomplete: {len(hot)} run(s) deferred, not run hot ({last}); cool the device and run the campaign "
            f"again")
