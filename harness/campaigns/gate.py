"""The cooldown gate before each run and the device-state sampler during it.

`wait_for_gate` polls Target.sample_state until the CPU is cool enough and MemAvailable high enough, or
the longest wait has passed (then it gives up and says so; the run still happens, and the report warns, or with
`on_timeout: defer` it is deferred: harness.campaigns.steady). It sleeps in steps of STEP_S, checking for a stop.
`StateSampler` records one sample about every second in a thread while the engine runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from harness import interrupts
from harness.campaigns.schema import Cooldown

STEP_S = 0.25  # the longest sleep between two checks for a stop while the gate waits


@dataclass
class GateResult:
    waited_s: float
    gave_up: bool
    reason: str | None  # why it waited or gave up; None when the condition held at once
    entry: dict  # the last sample: the run's entry state
    unchecked: list[str] = field(default_factory=list)  # conditions that could not be checked

    def record(self) -> dict:
        return {"waited_s": round(self.waited_s, 2), "gave_up": self.gave_up, "reason": self.reason,
                "unchecked": self.unchecked}


def _read(sample_state: Callable[[], dict]) -> dict:
    """One sample; a target that could not read its state (adb, ssh: the device went away) gives one with an
    "error" key, raised here so it is handled as a failed read, never recorded as a sample."""
    s = sample_state()
    if "error" in s:
        raise RuntimeError(s["error"])
    return s


def blocking(sample: dict, cd: Cooldown) -> tuple[list[str], list[str]]:
    """(conditions not met, conditions that cannot be checked) for one sample."""
    bad, unknown = [], []
    if cd.cpu_temp_max_c is not None:
        t = sample.get("cpu_temp_c")
        if t is None:
            unknown.append("cpu temperature (no CPU thermal zone readable)")
        elif t > cd.cpu_temp_max_c:
            bad.append(f"cpu {t:.1f} C > {cd.cpu_temp_max_c:g} C")
    if cd.mem_available_min_mib is not None:
        m = sample.get("mem_available_mib")
        if m is None:
            unknown.append("MemAvailable (no /proc/meminfo)")
        elif m < cd.mem_available_min_mib:
            bad.append(f"MemAvailable {m:.0f} MiB < {cd.mem_available_min_mib} MiB")
    return bad, unknown


def wait_for_gate(sample_state: Callable[[], dict], cd: Cooldown, *, clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep,
                  on_wait: Callable[[str], None] | None = None, step_s: float = STEP_S) -> GateResult:
    t0 = clock()
    first_reason: str | None = None
    while True:
        try:
            s = _read(sample_state)
        except Exception as e:  # e.g. the device went away: the run will fail and say why
            return GateResult(clock() - t0, False, f"device state unreadable: {type(e).__name__}: {e}", {},
                              ["device state"])
        bad, unknown = blocking(s, cd)
        waited = clock() - t0
        if not bad:
            return GateResult(waited, False, first_reason, s, unknown)
        first_reason = first_reason or "; ".join(bad)
        if waited >= cd.max_wait_s:
            return GateResult(waited, True, f"gave up after {waited:.0f} s: " + "; ".join(bad), s, unknown)
        pause = min(cd.poll_s, max(0.0, cd.max_wait_s - waited)) or cd.poll_s
        while pause > 0:  # in steps, each a chance to stop: a lab's poll_s of 10 s must not hold up Ctrl-C
            if on_wait is not None:
                on_wait("; ".join(bad))  # a fleet's device line raises KeyboardInterrupt once the campaign stops
            interrupts.check()
            step = min(step_s, pause)
            sleep(step)
            pause -= step


class StateSampler:
    """Calls sample_state about every `period_s` seconds in a daemon thread until stopped.

    clock gives the time (monotonic seconds) and wait(s) pauses up to s seconds; both are injected in
    tests, which call `run()` in their own thread instead of starting one. By default wait is the stop
    event's, so stop() ends a pause at once."""

    def __init__(self, sample_state: Callable[[], dict], period_s: float = 1.0, *,
                 clock: Callable[[], float] = time.monotonic,
                 wait: Callable[[float], object] | None = None):
        self._sample = sample_state
        self._period = period_s
        self._clock = clock
        self._stop = threading.Event()
        self._wait = wait if wait is not None else self._stop.wait
        self.samples: list[dict] = []
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self.run, name="state-sampler", daemon=True)

    def __enter__(self) -> StateSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run(self) -> None:
        """The sampling loop, until stop(): one sample, then a pause of what is left of the period."""
        while not self._stop.is_set():
            t = self._clock()
            try:
                self.samples.append(_read(self._sample))
            except Exception as e:  # a flaky read must not kill the run; it is recorded
                if len(self.errors) < 5:
                    self.errors.append(f"{type(e).__name__}: {e}")
            if not self._stop.is_set():
                self._wait(max(0.0, self._period - (self._clock() - t)))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5.0)
