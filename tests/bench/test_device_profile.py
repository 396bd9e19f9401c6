"""The device profile (tests/helpers/device_profile.py, tests/adbd/device-profile.sh, tests/adbd/profile-bin/)
through the real adb path: a real adbd per test in its own mount namespace with the profile laid over /sys
and a dumpsys on its PATH, read by the harness's own device-state sample (harness/devices/state.py's STATE_SCRIPT
and parsers, via AdbTarget) and by its shell. Run by tests/adbd/run-adb-tests.sh; skipped elsewhere.

Imports the harness by its current paths (harness.targets.adb, harness.devices.state)."""

from __future__ import annotations

import itertools
import os
import threading
import time
from pathlib import Path

import pytest

from harness.devices import state as devstate
from harness.devices.timeouts import BOUND, command_limits
from harness.targets.adb import AdbTarget
from tests.helpers.device_profile import PHONE, PHONE_B, DeviceProfile, ProfiledDevice, start_device

pytestmark = [pytest.mark.adb]

_ports = itertools.count(15601)  # clear of 15555-15556 (test_adb) and 15571-15574 (the fleet lab)


@pytest.fixture
def devices(tmp_path):
    """start(layout) -> (device, AdbTarget on it); every device and target is stopped at the end."""
    if not os.environ.get("BMOE_TEST_ADBD"):
        pytest.skip("needs BMOE_TEST_ADBD (set by tests/adbd/run-adb-tests.sh)")
    made: list[tuple[ProfiledDevice, AdbTarget | None]] = []

    def start(layout=PHONE, name: str = "p") -> tuple[ProfiledDevice, AdbTarget]:
        dev = start_device(DeviceProfile.create(tmp_path / name, layout), next(_ports))
        made.append((dev, None))
        target = AdbTarget(dev.serial)
        made[-1] = (dev, target)
        return dev, target

    yield start
    for dev, target in made:
        if target is not None:
            target.close()
        dev.stop()


def _sh(target: AdbTarget, command: str) -> str:
    code, out, err = target.device.shell(command)
    assert code == 0, f"`{command}` exit {code}: {out}{err}"
    return out


def test_the_harness_sample_sees_the_profile(devices):
    dev, target = devices(PHONE)
    s = target.sample_state()
    assert "error" not in s
    assert s["thermal"] == {z.type: z.temp_c for z in PHONE.zones}
    # devstate's own rule picks the CPU zones: cpu-*, cpuss-* (not gpuss, battery, skin-therm)
    assert s["cpu_temp_c"] == 37.5
    assert s["cpufreq"] == {
        "policy0": {"scaling_max_khz": 1_804_800, "cpuinfo_max_khz": 1_804_800, "scaling_cur_khz": 1_804_800},
        "policy4": {"scaling_max_khz": 2_419_200, "cpuinfo_max_khz": 2_419_200, "scaling_cur_khz": 2_419_200},
        "policy7": {"scaling_max_khz": 3_014_400, "cpuinfo_max_khz": 3_014_400, "scaling_cur_khz": 3_014_400},
    }
    assert s["battery"] == {"level": 80, "scale": 100, "temp_c": 28.0, "voltage_mv": 4012, "status": 2, "health": 2,
                            "plugged": "usb", "present": True, "technology": "Li-ion"}
    # the rest of what a later feature reads, at the real paths on the device
    assert _sh(target, "cat /sys/devices/system/cpu/cpufreq/policy4/related_cpus").split() == ["4", "5", "6"]
    assert "performance" in _sh(target, "cat /sys/devices/system/cpu/cpufreq/policy7/scaling_available_governors")
    assert _sh(target, "command -v dumpsys").strip() == f"{dev.profile.bin_dir}/dumpsys"
    # the test's own namespace (and the host) keep their /sys: the profile is the device's alone
    assert not set(devstate.read_local(Path("/"))["thermal"]) & {z.type for z in PHONE.zones}


def test_heating_throttling_and_cooling_are_seen(devices):
    dev, target = devices(PHONE)
    p = dev.profile
    p.heat(88.5)
    s = target.sample_state()
    assert s["cpu_temp_c"] == 88.5 and s["thermal"]["cpu-0-0"] == 88.5 and s["thermal"]["skin-therm"] == 73.5
    assert s["thermal"]["battery"] == 28.0  # not a CPU zone: left as it was

    p.throttle(7, 1_497_600)
    p.set_thermal_status(3)  # THROTTLING_SEVERE
    s = target.sample_state()
    big = s["cpufreq"]["policy7"]
    assert big["scaling_max_khz"] == 1_497_600 < big["cpuinfo_max_khz"] == 3_014_400
    assert big["scaling_cur_khz"] <= big["scaling_max_khz"]
    assert s["cpufreq"]["policy0"]["scaling_max_khz"] == s["cpufreq"]["policy0"]["cpuinfo_max_khz"]
    thermal = _sh(target, "dumpsys thermalservice")
    assert "Thermal Status: 3\n" in thermal and "IsStatusOverride: false\n" in thermal
    assert "\tTemperature{mValue=88.5, mType=0, mName=cpu-0-0, mStatus=0}\n" in thermal
    assert "\tTemperature{mValue=73.5, mType=3, mName=skin-therm, mStatus=3}\n" in thermal

    # a forced status (cmd thermalservice override-status) wins until reset, as on Android
    _sh(target, "cmd thermalservice override-status 1")
    assert "Thermal Status: 1\n" in _sh(target, "dumpsys thermalservice") and p.thermal_overridden()
    _sh(target, "cmd thermalservice reset")
    assert p.thermal_status() == 3 and not p.thermal_overridden()

    p.cool()
    s = target.sample_state()
    assert s["cpu_temp_c"] == 37.5
    assert all(v["scaling_max_khz"] == v["cpuinfo_max_khz"] for v in s["cpufreq"].values())
    assert "Thermal Status: 0\n" in _sh(target, "dumpsys thermalservice")


def test_battery_unplug_set_and_reset_change_what_dumpsys_prints(devices):
    dev, target = devices(PHONE)
    p = dev.profile
    before = _sh(target, "dumpsys battery")
    assert before.splitlines()[:3] == ["Current Battery Service state:", "  AC powered: false", "  USB powered: true"]
    assert devstate.parse_dumpsys_battery(before)["plugged"] == "usb"

    assert _sh(target, "dumpsys battery unplug") == ""
    after = _sh(target, "dumpsys battery")
    assert after.splitlines()[1] == "  (UPDATES STOPPED -- use 'reset' to restart)"
    assert devstate.parse_dumpsys_battery(after)["plugged"] is None
    assert target.sample_state()["battery"]["plugged"] is None
    assert p.battery_unplugged() and p.battery_frozen()

    # frozen: the hardware's changes are not shown until reset; `set level` changes the shown level
    p.set_battery(level=64)
    assert devstate.parse_dumpsys_battery(_sh(target, "dumpsys battery"))["level"] == 80
    _sh(target, "dumpsys battery set level 23")
    assert target.sample_state()["battery"]["level"] == 23
    assert _sh(target, "dumpsys battery get level") == "23\n"

    _sh(target, "dumpsys battery reset")
    b = target.sample_state()["battery"]
    assert (b["level"], b["plugged"]) == (64, "usb")
    assert not p.battery_frozen() and not p.battery_unplugged()
    assert "UPDATES STOPPED" not in _sh(target, "dumpsys battery")

    # the hardware itself unplugged: discharging, not frozen
    p.set_battery(charger=None)
    b = target.sample_state()["battery"]
    assert (b["plugged"], b["status"]) == (None, 3) and not p.battery_unplugged()


def test_dumpsys_battery_prints_android_14s_lines_in_order(devices):
    dev, target = devices(PHONE)
    dev.profile.set_battery(level=57, charger="ac", temp_c=31.2)
    assert _sh(target, "dumpsys battery") == (
        "Current Battery Service state:\n"
        "  AC powered: true\n  USB powered: false\n  Wireless powered: false\n  Dock powered: false\n"
        "  Max charging current: 500000\n  Max charging voltage: 5000000\n  Charge counter: 2565000\n"
        "  status: 2\n  health: 2\n  present: true\n  level: 57\n  scale: 100\n  voltage: 4012\n"
        "  temperature: 312\n  technology: Li-ion\n")


def test_the_existing_cooldown_gate_waits_for_a_hot_device_to_cool(devices):
    """harness/campaigns/gate.py's wait_for_gate on a profiled device through adb: it waits while the profile is
    hot and goes on once the test cools it (the ground a strict temperature target will be tested on)."""
    from harness.campaigns.gate import wait_for_gate
    from harness.formats.campaign import Cooldown

    dev, target = devices(PHONE)
    dev.profile.heat(88.5)
    cooler = threading.Timer(1.5, dev.profile.cool)
    cooler.start()
    try:
        g = wait_for_gate(target.sample_state, Cooldown(cpu_temp_max_c=45.0, max_wait_s=30.0, poll_s=0.2))
    finally:
        cooler.cancel()
    assert not g.gave_up and g.waited_s >= 1.0
    assert g.reason == "cpu 88.5 C > 45 C" and g.entry["cpu_temp_c"] == 37.5 and g.unchecked == []


def test_lab_commands_change_the_profile_and_can_be_undone(devices):
    """What a campaign's preparation will do to a phone, and undo: the profile records each change so a test
    can assert the device was restored (snapshot() equal before and after)."""
    dev, target = devices(PHONE)
    p = dev.profile
    before = p.snapshot()

    _sh(target, "svc power stayon usb")
    assert _sh(target, "settings get global stay_on_while_plugged_in").strip() == "2" and p.stay_on() == 2
    _sh(target, "svc power stayon true")
    assert p.stay_on() == 7 and "  mStayOn=true\n" in _sh(target, "dumpsys power")
    _sh(target, "input keyevent KEYCODE_SLEEP")
    assert not p.screen_on() and "  mWakefulness=Asleep\n" in _sh(target, "dumpsys power")
    assert _sh(target, "dumpsys deviceidle get screen") == "false\n"
    assert _sh(target, "dumpsys deviceidle force-idle") == "Now forced in to deep idle mode\n"
    idle = _sh(target, "dumpsys deviceidle")
    assert "  mForceIdle=true\n" in idle and "  mState=IDLE mLightState=OVERRIDE\n" in idle and p.idle_forced()
    _sh(target, "dumpsys battery unplug")
    _sh(target, "echo performance > /sys/devices/system/cpu/cpufreq/policy7/scaling_governor")
    _sh(target, "echo 2016000 > /sys/devices/system/cpu/cpufreq/policy4/scaling_min_freq")
    assert p.governor(7) == "performance" and p.freq(4)["scaling_min"] == 2_016_000
    changed = p.snapshot()
    assert {k for k in before if before[k] != changed[k]} == {
        "governors", "scaling_min_khz", "stay_on", "screen_on", "battery_frozen", "battery_shown", "idle_forced"}

    _sh(target, "settings put global stay_on_while_plugged_in 0")
    _sh(target, "input keyevent KEYCODE_WAKEUP")
    assert _sh(target, "dumpsys deviceidle unforce") == "Light state: ACTIVE, deep state: ACTIVE\n"
    _sh(target, "dumpsys battery reset")
    _sh(target, "echo schedutil > /sys/devices/system/cpu/cpufreq/policy7/scaling_governor")
    _sh(target, "echo 300000 > /sys/devices/system/cpu/cpufreq/policy4/scaling_min_freq")
    assert p.snapshot() == before


def test_two_devices_have_their_own_profiles(devices):
    a, ta = devices(PHONE, "a")
    b, tb = devices(PHONE_B, "b")
    sa, sb = ta.sample_state(), tb.sample_state()
    assert set(sa["cpufreq"]) == {"policy0", "policy4", "policy7"} and set(sb["cpufreq"]) == {"policy0", "policy6"}
    assert set(sa["thermal"]) == {z.type for z in PHONE.zones} and set(sb["thermal"]) == {z.type for z in PHONE_B.zones}
    assert (sa["battery"]["level"], sa["battery"]["plugged"]) == (80, "usb")
    assert (sb["battery"]["level"], sb["battery"]["plugged"]) == (55, None)
    assert sb["cpu_temp_c"] == 41.0

    # changing one leaves the other as it was, in sysfs and in dumpsys
    b.profile.heat(95.0)
    _sh(tb, "dumpsys battery unplug")
    _sh(tb, "echo powersave > /sys/devices/system/cpu/cpufreq/policy6/scaling_governor")
    assert ta.sample_state()["cpu_temp_c"] == 37.5 and tb.sample_state()["cpu_temp_c"] == 95.0
    assert "UPDATES STOPPED" not in _sh(ta, "dumpsys battery")
    assert b.profile.governor(6) == "powersave" and a.profile.governors() == {
        "policy0": "schedutil", "policy4": "schedutil", "policy7": "schedutil"}
    # each device's /data/local/tmp is its own too
    _sh(ta, "echo a > /data/local/tmp/mark")
    assert _sh(tb, "cat /data/local/tmp/mark 2>/dev/null || echo none").strip() == "none"


def test_the_session_device_has_no_profile(devices):
    """The profile is opt-in per device: the session's device (tests/bench/test_adb.py's) keeps no dumpsys and
    the VM's own sysfs, even while a profiled device runs next to it."""
    from tests.helpers.adbd import SERIAL

    if os.environ.get("BMOE_TEST_DEVICE_PROFILE"):
        pytest.skip("the session's device was given a profile (BMOE_TEST_DEVICE_PROFILE)")
    devices(PHONE)
    plain = AdbTarget(SERIAL)
    try:
        s = plain.sample_state()
        assert s["battery"] is None
        assert not set(s["thermal"]) & {z.type for z in PHONE.zones}
        assert plain.device.shell("command -v dumpsys")[0] != 0
    finally:
        plain.close()


def test_the_session_device_has_the_profile_it_was_given():
    """BMOE_TEST_DEVICE_PROFILE=DIR tests/adbd/run-adb-tests.sh ...: the session's device runs with DIR's profile
    (netns-session.sh), and keeps the session's /data (the file the test writes is the device's)."""
    from tests.helpers.adbd import SERIAL

    given = os.environ.get("BMOE_TEST_DEVICE_PROFILE")
    if not given:
        pytest.skip("the session's device has no profile (set BMOE_TEST_DEVICE_PROFILE to give it one)")
    profile = DeviceProfile.open(Path(given))
    t = AdbTarget(SERIAL)
    try:
        s = t.sample_state()
        assert s["thermal"] == profile.temps() and set(s["cpufreq"]) == set(profile.governors())
        assert s["battery"]["level"] == int(profile.battery()["level"])
        Path("/data/local/tmp/bmoe/profile-mark").write_text("shared")
        assert t.device.shell("cat /data/local/tmp/bmoe/profile-mark")[1] == "shared"
    finally:
        Path("/data/local/tmp/bmoe/profile-mark").unlink(missing_ok=True)
        t.close()


def test_a_fleet_lab_device_keeps_its_profile_across_a_restart(tmp_path):
    """tests/helpers/adb_fleet.py's Lab: a profiled device on a server of its own; killed and started again (as a
    lab loses a phone) it comes back with the same profile and whatever state the profile held."""
    from tests.helpers.adb_fleet import Lab

    if not os.environ.get("BMOE_TEST_ADBD"):
        pytest.skip("needs BMOE_TEST_ADBD (set by tests/adbd/run-adb-tests.sh)")
    profile = DeviceProfile.create(tmp_path / "fleet", PHONE_B)
    lab = Lab()
    try:
        lab.start_server(5047)
        port = next(_ports)
        serial = lab.start_device(port, 5047, profile.root)
        t = AdbTarget(serial, port=5047)
        try:
            assert set(t.sample_state()["cpufreq"]) == {"policy0", "policy6"}
            code, out, _ = t.device.shell("dumpsys battery unplug && dumpsys battery")
            assert code == 0 and "(UPDATES STOPPED" in out
        finally:
            t.close()
        profile.heat(77.0)
        lab.kill_device(port)
        lab.start_device(port, 5047)
        t = AdbTarget(serial, port=5047)
        try:
            s = t.sample_state()
            assert s["cpu_temp_c"] == 77.0 and s["battery"]["level"] == 55 and profile.battery_frozen()
            assert "(UPDATES STOPPED" in t.device.shell("dumpsys battery")[1]
        finally:
            t.close()
    finally:
        lab.close()


def test_a_slow_phones_state_sample_is_bounded_by_the_device_timeout_not_a_fixed_one(devices):
    """The state sample is a device call like any other: the command's or the campaign's device timeout bounds it
    (it had a fixed 10 s of its own, which a loaded machine's test phone overran)."""
    dev, target = devices(PHONE)
    dev.profile.set_dumpsys_delay(6)  # the sample asks dumpsys twice (battery, thermalservice): 12 s
    with command_limits(60):
        t0 = time.monotonic()
        s = target.sample_state()
        took = time.monotonic() - t0
    assert "error" not in s, s["error"]
    assert took >= 12 and s["battery"]["level"] == PHONE.battery_level and s["cpu_temp_c"] == 37.5
    with command_limits(3):
        t0 = time.monotonic()
        s = target.sample_state()
        took = time.monotonic() - t0
    assert BOUND in s.get("error", ""), s
    assert took < 12  # gave up at its 3 s bound (a loaded machine's slack), not after the dumps
    dev.profile.set_dumpsys_delay(None)
    assert "error" not in target.sample_state()
