"""Holding the device steady (issue 35 item 2) without a device: the fixed cool-down between runs and the deferral
policy on an injected clock (harness.campaigns.steady), throttle detection from samples (harness.devices.throttle),
Android's thermal status as the device profile's dumpsys prints it, read by the state script; and whole campaigns on
this machine whose device state is a device profile's tree (tests/helpers/device_profile.py) read through the
harness's own parser (devstate.read_local on the profile's root), with a real engine process per run
(tests/fixtures/fake_engine.py): a strict temperature target leaves runs unrun and `run` again runs them; a
deferred run goes to the end of the queue; a fleet's cool device takes a hot one's deferred runs.
Over a real adbd device with a profile: tests/bench/test_held_steady_adb.py."""

from __future__ import annotations

import os
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import pytest

from harness.campaigns.gate import GateResult
from harness.campaigns.runner import run_campaign
from harness.campaigns.steady import DeferQueue, Pacer, deferral
from harness.devices import state as devstate
from harness.devices.throttle import throttle_record
from harness.formats.campaign import Cooldown
from harness.formats.manifest import load_manifest
from harness.report.build import write_report
from harness.report.checker import check_folder
from harness.targets.local import LocalTarget
from tests.helpers.device_profile import PHONE, DeviceProfile
from tests.helpers.runner import engine, quiet
from tests.helpers.sigint import sigint_after


class Clock:
    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(round(s, 6))
        self.t += s


# ---- the fixed cool-down between runs ----------------------------------------------------------------------

def test_the_cool_down_waits_only_after_an_engine_ran_in_short_steps():
    clock = Clock()
    seen: list[str] = []
    p = Pacer(3.0, clock=clock, sleep=clock.sleep)
    assert p.rest(seen.append) == 0.0 and clock.t == 0 and seen == []  # the session's first run
    p.ran()
    assert p.rest(seen.append) == 3.0
    assert clock.sleeps == [0.25] * 12 and seen[0] == "between runs 0/3 s" and len(seen) == 12
    assert p.rest(seen.append) == 0.0  # nothing ran since (a deferred run): no second wait
    assert Pacer(0.0).rest() is None  # not asked for: not recorded


def test_a_stop_ends_the_cool_down_at_the_next_step():
    clock = Clock()
    calls = []

    def on_wait(why: str) -> None:  # a fleet's device line raises once the campaign is stopped
        calls.append(why)
        if len(calls) == 3:
            raise KeyboardInterrupt

    p = Pacer(600.0, clock=clock, sleep=clock.sleep)
    p.ran()
    with pytest.raises(KeyboardInterrupt):
        p.rest(on_wait)
    assert clock.t == 0.5


def test_ctrl_c_interrupts_a_real_cool_down_promptly():
    p = Pacer(120.0)
    p.ran()
    t0 = time.monotonic()
    # a real SIGINT through the handler every bmoe-bench command installs (a bare one depends on the handler an
    # earlier test in this process left: a suite run saw "DID NOT RAISE" after the whole 120 s)
    with sigint_after(0.5), pytest.raises(KeyboardInterrupt):
        p.rest()
    assert time.monotonic() - t0 < 30  # a 120 s cool-down, stopped at once (generous: a loaded machine)


# ---- the strict temperature target ---------------------------------------------------------------------------

def _gate(gave_up: bool) -> GateResult:
    return GateResult(12.0, gave_up, "gave up after 12 s: cpu 88.5 C > 45 C" if gave_up else None,
                      {"cpu_temp_c": 88.5 if gave_up else 40.0})


def test_only_a_strict_target_defers_and_only_when_the_gate_gave_up():
    strict = Cooldown(cpu_temp_max_c=45, on_timeout="defer")
    d = deferral(_gate(True), strict, "2026-01-01T00:00:00.000Z", 30.0)
    assert d is not None and d.reason == "gave up after 12 s: cpu 88.5 C > 45 C"
    assert (d.waited_s, d.cpu_temp_c, d.rested_s) == (12.0, 88.5, 30.0)
    assert deferral(_gate(False), strict, "t", None) is None  # cool in time: it runs
    assert deferral(_gate(True), Cooldown(cpu_temp_max_c=45), "t", None) is None  # on_timeout: run (the default)


def test_a_deferred_run_goes_to_the_end_and_is_left_past_its_budget():
    q = DeferQueue([0, 1, 2], max_deferrals=1)
    order = []
    hot = {1}
    while (i := q.take()) is not None:
        if i in hot:
            q.defer(i)
            continue
        order.append(i)
    assert order == [0, 2] and q.left == [1] and q.budget.count == {1: 2}  # tried twice, then left
    q = DeferQueue([0, 1], max_deferrals=0)
    assert q.take() == 0 and q.defer(0) is False and q.left == [0] and q.take() == 1


# ---- throttling ----------------------------------------------------------------------------------------------

def _s(t: float, cap7: int, status: int | None = 0) -> dict:
    return {"t": t, "thermal_status": status, "cpufreq": {
        "policy0": {"scaling_max_khz": 1_804_800, "cpuinfo_max_khz": 1_804_800},
        "policy7": {"scaling_max_khz": cap7, "cpuinfo_max_khz": 3_014_400}}}


def test_throttle_record_names_the_capped_policies_the_status_and_the_seconds():
    full = 3_014_400
    r = throttle_record([_s(0, full), _s(1, 1_507_200, 3), _s(2.5, 2_000_000), _s(3, full)], end_t=4.0)
    assert r.throttled and r.capped == {"policy7": 0.5} and r.min_cap == 0.5 and r.max_thermal_status == 3
    assert (r.throttled_s, r.samples, r.throttled_samples) == (2.0, 4, 2)
    calm = throttle_record([_s(0, full), _s(1, full)])
    assert not calm.throttled and calm.capped == {} and calm.min_cap is None and calm.throttled_s == 0
    status_only = throttle_record([{"t": 0, "thermal_status": 2}, {"t": 1.5, "thermal_status": 0}])
    assert status_only.throttled and status_only.capped == {} and status_only.throttled_s == 1.5
    assert throttle_record([{"t": 0, "cpu_temp_c": 40.0}]) is None  # nothing could tell: unknown, not "calm"
    assert throttle_record([]) is None


def test_the_state_script_reads_android_thermal_status_from_the_profiles_dumpsys(tmp_path):
    p = DeviceProfile.create(tmp_path / "p", PHONE)
    p.set_thermal_status(3)
    p.throttle(7, 1_497_600)
    env = {**os.environ, "PATH": f"{p.bin_dir}:{os.environ['PATH']}"}
    out = subprocess.run(["sh", "-c", devstate.STATE_SCRIPT, "sh", str(p.root)], env=env, capture_output=True,
                         text=True, check=True, timeout=60).stdout
    s = devstate.parse_state_dump(out, t=1.0)
    assert s["thermal_status"] == 3 and s["battery"]["level"] == 80
    assert s["cpufreq"]["policy7"]["scaling_max_khz"] == 1_497_600
    r = throttle_record([s])
    assert r.capped == {"policy7": round(1_497_600 / 3_014_400, 4)} and r.max_thermal_status == 3
    text = subprocess.run([str(p.bin_dir / "dumpsys"), "thermalservice"], capture_output=True, text=True,
                          check=True, timeout=60).stdout
    assert devstate.parse_thermal_status(text) == 3  # Android 14's dump, as the profile prints it
    assert devstate.parse_thermal_status("Can't find service: thermalservice\n") is None


# ---- whole campaigns on a profiled state -----------------------------------------------------------------------

class ProfiledLocal(LocalTarget):
    """This machine, its device state read from a profile's tree (the profile's sysfs files, the same parser).
    `heat_after_run`: the profile is heated when a run ends; `cool_after_hot_gates`: it cools once the cooldown gate
    (not the sampler during a run) has read it hot that many times, as a device cools while it waits."""

    def __init__(self, profile: DeviceProfile, *, heat_after_run: int = 0, cool_after_hot_gates: int = 0):
        super().__init__()
        self.profile = profile
        self.heat_after_run, self.cool_after = heat_after_run, cool_after_hot_gates
        self.runs = self.hot_gates = 0

    def run(self, argv, **kw):
        out = super().run(argv, **kw)
        if argv[-1:] != ["--version"]:
            self.runs += 1
            if self.runs == self.heat_after_run:
                self.profile.heat(88.5)
        return out

    def sample_state(self) -> dict:
        s = devstate.read_local(self.profile.root)
        if threading.current_thread().name != "state-sampler" and (s["cpu_temp_c"] or 0) > 45:
            self.hot_gates += 1
            if self.hot_gates == self.cool_after:
                self.profile.cool()
        return s


def _campaign(tmp_path: Path, *, cells: int = 2, extra: str = "", max_wait_s: float = 0.3,
              max_deferrals: int = 1) -> Path:
    exe = engine(tmp_path)
    model = tmp_path / "model.bin"
    model.write_bytes(b"\0" * 4096)
    p = tmp_path / "hot.yaml"
    speeds = ", ".join(str(20 + 10 * k) for k in range(cells - 1))
    p.write_text(textwrap.dedent(f"""\
        name: hot
        model: {{path: {model}}}
        engine: {{kind: external, path: {exe}}}
        flags: {{--speed: 10}}
        repeats: 1
        tokens: 6
        warmup_tokens: 1
        cooldown: {{cpu_temp_max_c: 45, max_wait_s: {max_wait_s}, poll_s: 0.1, on_timeout: defer,
                   max_deferrals: {max_deferrals}}}
        timeout_s: 60
        axes:
          - {{flag: --speed, values: [{speeds}]}}
        """) + extra)
    return p


def test_a_strict_target_leaves_a_hot_devices_runs_unrun_and_run_again_runs_them(tmp_path):
    prof = DeviceProfile.create(tmp_path / "p", PHONE)
    prof.heat(88.5)
    p = _campaign(tmp_path)
    res = run_campaign(p, root=tmp_path / "bd", console=quiet(), target=ProfiledLocal(prof))
    assert (res.n_ok, res.n_failed, res.n_deferred) == (0, 0, 2) and "cpu 88.5 C > 45 C" in res.deferred
    m = load_manifest(res.folder)
    assert m.status.startswith("incomplete: 2 run(s) deferred, not run hot (gave up after ")
    assert all(not r.finished and len(r.deferrals) == 2 for r in m.runs)  # tried, deferred once, tried, left
    assert all(d.cpu_temp_c == 88.5 and d.waited_s >= 0.3 for r in m.runs for d in r.deferrals)
    assert list((res.folder / "runs").iterdir()) == []  # nothing started, nothing half-written
    problems = check_folder(res.folder).problems
    assert any(x.startswith("cell 0 ('base') lacks 1 run(s) because the device did not meet the cooldown "
                            "condition (gave up after ") for x in problems), problems
    assert not any("has not run (pending)" in x for x in problems)

    prof.cool()
    res2 = run_campaign(p, root=tmp_path / "bd", console=quiet(), target=ProfiledLocal(prof))
    assert res2.folder == res.folder and (res2.n_ok, res2.n_deferred) == (2, 0)
    m2 = load_manifest(res.folder)
    assert m2.status == "complete" and all(r.status == "ok" and len(r.deferrals) == 2 for r in m2.runs)
    assert all(r.throttle is not None and not r.throttle.throttled for r in m2.runs)
    write_report(res.folder)
    text = (res.folder / "findings.md").read_text()
    assert "(deferred 2x: the device stayed hot)" in text and "strict: a run the gate gave up on is deferred" in text
    assert check_folder(res.folder).ok, check_folder(res.folder).problems


def test_with_replicate_a_deferred_run_goes_to_the_end_of_its_own_try(tmp_path):
    """A strict target and replication together: a run deferred in try 1 is tried again before try 2 begins, never
    after a later try's runs (the tries stay separate passes)."""
    prof = DeviceProfile.create(tmp_path / "p", PHONE)
    prof.heat(88.5)
    p = _campaign(tmp_path, extra="replicate: {tries: 2, within_pct: 5, wait_s: 0}\n")
    res = run_campaign(p, root=tmp_path / "bd", console=quiet(), target=ProfiledLocal(prof))
    assert (res.n_ok, res.n_deferred) == (0, 4)
    m = load_manifest(res.folder)
    at = {k: [d.at for r in m.runs if r.try_index == k for d in r.deferrals] for k in (0, 1)}
    assert len(at[0]) == len(at[1]) == 4  # each run tried, deferred, tried again, left
    assert max(at[0]) < min(at[1])  # every deferral of try 1 before any of try 2


def test_a_deferred_run_goes_to_the_end_of_the_queue_and_runs_once_the_device_cooled(tmp_path):
    prof = DeviceProfile.create(tmp_path / "p", PHONE)
    # the first run heats the device; the next gate reads it hot once (max_wait_s 0: gives up at once), then it
    # has cooled: the second run is deferred to the end, the third runs, then the second
    target = ProfiledLocal(prof, heat_after_run=1, cool_after_hot_gates=1)
    res = run_campaign(_campaign(tmp_path, cells=3, max_wait_s=0), root=tmp_path / "bd", console=quiet(),
                       target=target)
    assert (res.n_ok, res.n_deferred) == (3, 0)
    m = load_manifest(res.folder)
    by = {r.run_id: r for r in m.runs}
    assert [len(by[x].deferrals) for x in ("r01-c00", "r01-c01", "r01-c02")] == [0, 1, 0]
    assert by["r01-c00"].start < by["r01-c02"].start < by["r01-c01"].start
    assert m.status == "complete"


def test_a_fixed_cool_down_comes_before_every_run_after_the_first_and_is_recorded(tmp_path):
    prof = DeviceProfile.create(tmp_path / "p", PHONE)
    p = _campaign(tmp_path, cells=2)
    p.write_text(p.read_text().replace("on_timeout: defer", "on_timeout: defer, between_runs_s: 0.6"))
    res = run_campaign(p, root=tmp_path / "bd", console=quiet(), target=ProfiledLocal(prof))
    m = load_manifest(res.folder)
    rested = [r.gate.rested_s for r in sorted(m.runs, key=lambda r: r.start)]
    assert rested[0] == 0.0 and 0.6 <= rested[1] < 30
    assert m.campaign.cooldown.between_runs_s == 0.6


def test_in_a_spread_fleet_a_cool_device_takes_a_hot_ones_deferred_runs(tmp_path):
    hot = DeviceProfile.create(tmp_path / "hot", PHONE)
    hot.heat(88.5)
    cool = DeviceProfile.create(tmp_path / "cool", PHONE)
    extra = textwrap.dedent("""\
        targets:
          - {serial: one, label: hot}
          - {serial: two, label: cool}
        fleet: {use: spread}
        """)
    p = _campaign(tmp_path, cells=2, extra=extra, max_wait_s=0.5, max_deferrals=100)
    p.write_text(p.read_text().replace("repeats: 1", "repeats: 2"))
    res = run_campaign(p, root=tmp_path / "bd", console=quiet(),
                       fleet_target=lambda d: ProfiledLocal(hot if d.label == "hot" else cool))
    assert (res.n_ok, res.n_not_run, res.n_deferred) == (4, 0, 0)
    m = load_manifest(res.folder)
    assert m.status == "complete" and all(r.device == "cool" for r in m.runs)
    assert any(r.deferrals for r in m.runs)  # the hot device took at least one and gave it back


def test_in_a_compare_fleet_a_hot_devices_runs_are_left_deferred(tmp_path):
    hot = DeviceProfile.create(tmp_path / "hot", PHONE)
    hot.heat(88.5)
    cool = DeviceProfile.create(tmp_path / "cool", PHONE)
    extra = textwrap.dedent("""\
        targets:
          - {serial: one, label: hot}
          - {serial: two, label: cool}
        fleet: {use: compare}
        """)
    res = run_campaign(_campaign(tmp_path, cells=2, extra=extra, max_deferrals=1), root=tmp_path / "bd",
                       console=quiet(), fleet_target=lambda d: ProfiledLocal(hot if d.label == "hot" else cool))
    assert (res.n_ok, res.n_not_run, res.n_deferred) == (2, 0, 2)
    m = load_manifest(res.folder)
    assert m.status.startswith("incomplete: 2 run(s) deferred, not run hot")
    left = [r for r in m.runs if not r.finished]
    assert len(left) == 2 and all(len(r.deferrals) == 2 for r in left)
    assert all(r.device == "cool" for r in m.runs if r.finished)
    hot.cool()
    res2 = run_campaign(_campaign(tmp_path, cells=2, extra=extra, max_deferrals=1), root=tmp_path / "bd",
                        console=quiet(), fleet_target=lambda d: ProfiledLocal(hot if d.label == "hot" else cool))
    assert res2.folder == res.folder and (res2.n_ok, res2.n_deferred) == (4, 0)
    assert load_manifest(res.folder).status == "complete"


def test_the_new_keys_enter_the_plan_only_when_set_so_older_folders_resume():
    from harness.campaigns.runner import _cooldown

    assert _cooldown(Cooldown(max_wait_s=5)).model_dump(exclude_unset=True) == {
        "cpu_temp_max_c": None, "mem_available_min_mib": None, "max_wait_s": 5.0, "poll_s": 2.0}  # as before them
    strict = _cooldown(Cooldown(on_timeout="defer", between_runs_s=30)).model_dump(exclude_unset=True)
    assert strict["on_timeout"] == "defer" and strict["between_runs_s"] == 30 and "max_deferrals" not in strict
