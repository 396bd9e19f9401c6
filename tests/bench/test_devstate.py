"""Device-state parsing against fixture sysfs trees (tests/fixtures/sysfs/): the Python reader and the
device-side shell script must give the same sample."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from harness.devices import state as devstate

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs"
PHONE, PC = FIX / "phone", FIX / "pc"
BATTERY = (FIX / "dumpsys_battery.txt").read_text()


def test_meminfo_in_mib_and_missing_fields_are_none():
    m = devstate.parse_meminfo((PHONE / "proc/meminfo").read_text())
    assert m == {
        "mem_total_mib": 7507.7,
        "mem_available_mib": 3072.0,
        "mem_free_mib": 305.1,
        "cached_mib": 2560.0,
        "swap_free_mib": 3584.0,
    }
    pc = devstate.parse_meminfo((PC / "proc/meminfo").read_text())
    assert pc["swap_free_mib"] is None  # no SwapFree line: unknown, not 0
    assert devstate.parse_meminfo("") == dict.fromkeys(m, None)


@pytest.mark.parametrize(
    "raw, want",
    [("41200\n", 41.2), ("-3500", -3.5), ("35", 35.0), ("", None), ("N/A", None), (None, None), ("0", 0.0)],
)
def test_temp_c(raw, want):
    assert devstate.temp_c(raw) == want


@pytest.mark.parametrize(
    "ztype, cpu",
    [
        ("cpu-0-0-usr", True),
        ("cpuss-0-usr", True),
        ("mtktscpu", True),
        ("BIG", True),
        ("LITTLE", True),
        ("x86_pkg_temp", True),
        ("soc_thermal", True),
        ("cpu_big0", True),
        ("battery", False),
        ("skin-therm", False),
        ("gpuss-0-usr", False),
        ("acpitz", False),
        ("xo-therm", False),
    ],
)
def test_cpu_zone_classification(ztype, cpu):
    assert devstate.is_cpu_zone(ztype) is cpu


def test_phone_tree_sample():
    s = devstate.read_local(PHONE, t=123.0, battery_text=BATTERY)
    assert s["t"] == 123.0
    assert s["mem_available_mib"] == 3072.0
    assert s["thermal"] == {
        "aoss0-usr": 36.5,
        "cpu-0-0-usr": 41.2,
        "cpu-1-4-usr": 47.8,
        "cpuss-0-usr": 45.1,
        "gpuss-0-usr": 39.0,
        "battery": 31.0,
        "skin-therm": 33.4,
        "cpu-0-0-usr/thermal_zone7": 40.0,  # a repeated type keeps its reading
        "sdm-therm": -3.5,
        "xo-therm": 35.0,  # whole degrees from an old driver
    }  # thermal_zone8 has no readable temp: left out
    assert s["cpu_temp_c"] == 47.8  # hottest CPU zone; the battery and skin sensors are not CPU
    assert s["cpufreq"] == {
        "policy0": {"scaling_max_khz": 1804800, "cpuinfo_max_khz": 1804800, "scaling_cur_khz": 1017600},
        "policy4": {"scaling_max_khz": 2419200, "cpuinfo_max_khz": 2419200, "scaling_cur_khz": 2419200},
        "policy7": {"scaling_max_khz": 1900800, "cpuinfo_max_khz": 2841600, "scaling_cur_khz": 1900800},
    }
    assert s["battery"] == {
        "level": 87,
        "scale": 100,
        "temp_c": 29.6,
        "voltage_mv": 4213,
        "status": 2,
        "health": 2,
        "plugged": "usb",
        "present": True,
        "technology": "Li-ion",
    }


def test_pc_tree_sample_orders_policies_naturally():
    s = devstate.read_local(PC, t=0.0)
    assert s["cpu_temp_c"] == 54.0
    assert list(s["cpufreq"]) == ["policy0", "policy1", "policy2", "policy3", "policy10", "policy11"]
    assert s["battery"] is None


def test_empty_tree_gives_none_and_empty_never_zero(tmp_path):
    s = devstate.read_local(tmp_path, t=1.0)
    assert s == {
        "t": 1.0,
        "mem_total_mib": None,
        "mem_available_mib": None,
        "mem_free_mib": None,
        "cached_mib": None,
        "swap_free_mib": None,
        "thermal": {},
        "cpu_temp_c": None,
        "cpufreq": {},
        "battery": None,
        "thermal_status": None,
    }


def test_battery_text_without_level_is_none():
    assert devstate.parse_dumpsys_battery("/system/bin/sh: dumpsys: not found\n") is None
    assert devstate.parse_dumpsys_battery("") is None
    assert devstate.parse_dumpsys_battery(None) is None


def _run_script(root: Path, path_prefix: str | None = None) -> str:
    env = dict(os.environ)
    if path_prefix:
        env["PATH"] = f"{path_prefix}:{env['PATH']}"
    else:
        env["PATH"] = "/usr/bin:/bin"  # no dumpsys here
    r = subprocess.run(
        ["sh", "-c", devstate.STATE_SCRIPT, "sh", str(root)],
        capture_output=True,
        text=True,
        env=env,
        timeout=10,
        check=True,
    )
    return r.stdout


@pytest.mark.parametrize("tree", [PHONE, PC])
def test_device_script_matches_python_reader(tree):
    dump = _run_script(tree)
    assert devstate.parse_state_dump(dump, t=5.0) == devstate.read_local(tree, t=5.0)


def test_device_script_reads_dumpsys_battery_when_present(tmp_path):
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "dumpsys").write_text(f'#!/bin/sh\n[ "$1" = battery ] && cat {FIX / "dumpsys_battery.txt"}\n')
    (shim / "dumpsys").chmod(0o755)
    s = devstate.parse_state_dump(_run_script(PHONE, str(shim)), t=0.0)
    assert s["battery"]["level"] == 87 and s["battery"]["temp_c"] == 29.6
    assert s == devstate.read_local(PHONE, t=0.0, battery_text=BATTERY)


def test_device_script_on_an_empty_tree(tmp_path):
    assert devstate.parse_state_dump(_run_script(tmp_path), t=1.0) == devstate.read_local(tmp_path, t=1.0)
