"""The cooldown gate before each run and the device-state sampler during it."""

import time

from harness.campaigns.gate import StateSampler, wait_for_gate
from harness.campaigns.schema import Cooldown


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


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


def test_gate_reports_what_it_cannot_check():
    g = wait_for_gate(lambda: {"cpu_temp_c": None, "mem_available_mib": 5000.0},
                      Cooldown(cpu_temp_max_c=60, mem_available_min_mib=1000), sleep=lambda s: None)
    assert not g.gave_up and g.unchecked == ["cpu temperature (no CPU thermal zone readable)"]


def test_gate_survives_an_unreadable_device():
    def gone():
        raise ConnectionError("device offline")

    g = wait_for_gate(gone, Cooldown(cpu_temp_max_c=60), sleep=lambda s: None)
    assert not g.gave_up and g.reason == "device state unreadable: ConnectionError: device offline"
    assert g.entry == {} and g.unchecked == ["device state"]


def test_sampler_takes_about_one_sample_per_period():
    n = [0]

    def sample():
        n[0] += 1
        return {"t": time.time(), "i": n[0]}

    with StateSampler(sample, period_s=0.1) as s:
        time.sleep(0.55)
    assert 4 <= len(s.samples) <= 8
    assert [x["i"] for x in s.samples] == list(range(1, len(s.samples) + 1))
