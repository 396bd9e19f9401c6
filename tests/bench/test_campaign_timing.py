"""The campaign's timed parts on an injected clock, with no real sleeps: the cooldown gate's waits, the
state sampler's period, and the progress ETA."""

from __future__ import annotations

import threading
import time
from io import StringIO

import pytest
from rich.console import Console

from harness.campaigns.gate import StateSampler, wait_for_gate
from harness.campaigns.progress import RunProgress, eta_text
from harness.campaigns.schema import Cooldown


class FakeClock:
    """A monotonic clock that moves only when told (sleep(s) advances it by s)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


# ---- the cooldown gate ---------------------------------------------------------------------------------


def test_gate_waits_until_cool():
    temps = iter([70.0, 65.0, 50.0])
    clock = FakeClock()
    g = wait_for_gate(lambda: {"cpu_temp_c": next(temps), "mem_available_mib": 5000.0},
                      Cooldown(cpu_temp_max_c=60, mem_available_min_mib=1000, max_wait_s=100, poll_s=10),
                      clock=clock, sleep=clock.sleep)
    assert not g.gave_up and g.waited_s == 20 and g.entry["cpu_temp_c"] == 50.0
    assert g.reason == "cpu 70.0 C > 60 C"


def test_gate_gives_up_and_says_so():
    clock = FakeClock()
    g = wait_for_gate(lambda: {"cpu_temp_c": 40.0, "mem_available_mib": 500.0},
                      Cooldown(cpu_temp_max_c=60, mem_available_min_mib=1000, max_wait_s=30, poll_s=10),
                      clock=clock, sleep=clock.sleep)
    assert g.gave_up and g.waited_s == 30
    assert g.reason == "gave up after 30 s: MemAvailable 500 MiB < 1000 MiB"


def test_gate_last_poll_is_cut_to_the_longest_wait():
    clock = FakeClock()
    waits: list[float] = []

    def sleep(s: float) -> None:
        waits.append(s)
        clock.sleep(s)

    g = wait_for_gate(lambda: {"cpu_temp_c": 90.0}, Cooldown(cpu_temp_max_c=60, max_wait_s=25, poll_s=10),
                      clock=clock, sleep=sleep, step_s=100)
    assert waits == [10, 10, 5] and g.gave_up and g.waited_s == 25


def test_gate_sleeps_in_steps_and_a_stop_ends_a_long_poll_at_once():
    clock = FakeClock()
    waits: list[float] = []
    reads = []

    def sleep(s: float) -> None:
        waits.append(s)
        clock.sleep(s)

    g = wait_for_gate(lambda: reads.append(1) or {"cpu_temp_c": 90.0},
                      Cooldown(cpu_temp_max_c=60, max_wait_s=20, poll_s=10), clock=clock, sleep=sleep, step_s=0.25)
    assert g.gave_up and g.waited_s == 20 and len(reads) == 3  # still one read per poll_s
    assert set(waits) == {0.25} and len(waits) == 80

    def stop_after(n: int):  # a fleet's device line: raises once the campaign is stopped
        calls = []

        def on_wait(_reason: str) -> None:
            calls.append(1)
            if len(calls) > n:
                raise KeyboardInterrupt
        return on_wait

    clock = FakeClock()
    with pytest.raises(KeyboardInterrupt):
        wait_for_gate(lambda: {"cpu_temp_c": 90.0}, Cooldown(cpu_temp_max_c=60, max_wait_s=900, poll_s=10),
                      clock=clock, sleep=clock.sleep, on_wait=stop_after(2), step_s=0.25)
    assert clock.t == 0.5  # stopped two steps into a 10 s poll, not at its end


def test_gate_reports_what_it_cannot_check():
    clock = FakeClock()
    g = wait_for_gate(lambda: {"cpu_temp_c": None, "mem_available_mib": 5000.0},
                      Cooldown(cpu_temp_max_c=60, mem_available_min_mib=1000), clock=clock, sleep=clock.sleep)
    assert not g.gave_up and g.waited_s == 0 and g.unchecked == ["cpu temperature (no CPU thermal zone readable)"]


def test_gate_survives_an_unreadable_device():
    def gone():
        raise ConnectionError("device offline")

    clock = FakeClock()
    g = wait_for_gate(gone, Cooldown(cpu_temp_max_c=60), clock=clock, sleep=clock.sleep)
    assert not g.gave_up and g.reason == "device state unreadable: ConnectionError: device offline"
    assert g.entry == {} and g.unchecked == ["device state"]


# ---- the state sampler ---------------------------------------------------------------------------------


def _sampler(read_s: float, period_s: float, until_s: float, fail_every: int = 0):
    """Run a StateSampler on a fake clock until it reaches until_s: (sampler, the pauses it asked for).
    Each read takes read_s; with fail_every=k every k-th read raises."""
    clock = FakeClock()
    waits: list[float] = []
    n = [0]

    def sample() -> dict:
        n[0] += 1
        clock.sleep(read_s)
        if fail_every and n[0] % fail_every == 0:
            raise OSError(f"read {n[0]} failed")
        return {"t": clock(), "i": n[0]}

    def wait(s: float) -> None:
        waits.append(s)
        clock.sleep(s)
        if clock() >= until_s:
            sampler.stop()

    sampler = StateSampler(sample, period_s=period_s, clock=clock, wait=wait)
    sampler.run()
    return sampler, waits


def test_sampler_takes_one_sample_per_period():
    s, waits = _sampler(read_s=0.03, period_s=0.1, until_s=0.55)
    assert [x["i"] for x in s.samples] == [1, 2, 3, 4, 5, 6]  # at 0.0, 0.1, ... 0.5
    assert [x["t"] for x in s.samples] == pytest.approx([0.03, 0.13, 0.23, 0.33, 0.43, 0.53])
    assert waits == pytest.approx([0.07] * 6)  # the rest of each period, the read's own time deducted
    assert s.errors == []


def test_sampler_slower_than_its_period_does_not_pause_or_catch_up():
    s, waits = _sampler(read_s=0.25, period_s=0.1, until_s=1.0)
    assert len(s.samples) == 4 and waits == [0.0] * 4


def test_sampler_records_failed_reads_and_goes_on():
    s, _ = _sampler(read_s=0.01, period_s=1.0, until_s=20.0, fail_every=3)
    assert len(s.samples) == 14  # 20 reads, 6 failed
    assert s.errors == [f"OSError: read {i} failed" for i in (3, 6, 9, 12, 15)]  # the first five kept


def test_sampler_thread_stops_at_once_in_a_long_pause():
    got = threading.Event()

    def sample() -> dict:
        got.set()
        return {}

    t0 = time.monotonic()
    with StateSampler(sample, period_s=3600.0) as s:
        assert got.wait(10.0)
    assert time.monotonic() - t0 < 10.0 and len(s.samples) == 1  # stop() ended the hour's pause


# ---- progress ------------------------------------------------------------------------------------------


def test_eta_from_finished_runs():
    assert eta_text([], 5, 0) == "ETA after the first run"
    assert eta_text([60.0, 120.0], 4, 0) == "ETA 6m00s"  # 4 x 90 s
    assert eta_text([60.0, 120.0], 4, 30.0) == "ETA 5m30s"  # 30 s into the current one
    assert eta_text([3600.0], 2, 0) == "ETA 2h00m"


def test_progress_times_runs_on_its_clock():
    clock = FakeClock()
    out = StringIO()
    with RunProgress(Console(file=out, width=200), total_runs=4, done_runs=0, n_cells=2, tokens=6,
                     clock=clock) as prog:
        for i, secs in enumerate((60.0, 120.0)):
            prog.start_run(f"r01-c0{i}", f"cell{i}", 1, 2, cell=i)
            clock.sleep(secs)
            prog.end_run(f"r01-c0{i}", f"cell{i}", {"status": "ok", "tokens": 6, "wall_s": secs})
        prog.start_run("r02-c00", "cell0", 2, 2, cell=0)
        clock.sleep(30.0)
        prog.token({"step": 3, "steps": 6, "wall_ms": 500.0})
        desc = prog.p.tasks[prog.t_runs].description
    assert prog.durations == [60.0, 120.0]
    assert desc == "runs (2 cells, ETA 2m30s)"  # 2 left x 90 s, 30 s into the current one
    assert "r01-c01 cell1: ok, 6 tokens, 120.0 s" in out.getvalue()
