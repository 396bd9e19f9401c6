"""Holding the device steady (issue 35 item 2) on a real adbd device with a device profile (tests/adbd/README.md):
`bmoe-bench run` with a strict temperature target on a heated phone defers its runs and runs none hot, and runs them
once the phone has cooled; throttling during a run (a policy capped below its maximum and Android's thermal status
raised, by the device itself while the engine runs) is recorded in that run's record and marked next to its cell in
findings.md; the fixed cool-down between runs is recorded. Run by tests/adbd/run-adb-tests.sh; skipped elsewhere."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from harness.formats.manifest import load_manifest
from harness.report.checker import check_folder
from tests.helpers.device_profile import PHONE, DeviceProfile
from tests.helpers.runner import BENCH
from tests.helpers.sh_engine import PROGRESS, adb_campaign, sh_engine

pytestmark = [pytest.mark.adb]

# a POSIX sh engine: writes a bmoe_metrics v2 CSV where --csv says and BMOE_PROGRESS lines; `--throttle S` makes
# the device throttle while it runs, as a thermal governor would: policy7's scaling_max_freq at half its maximum and
# the thermal HAL's status SEVERE (3, what `dumpsys thermalservice` shows) for S seconds, then both back
_THROTTLE = r"""if [ "$hold" != 0 ]; then
  d=/sys/devices/system/cpu/cpufreq/policy7
  st="$(dirname "$(command -v dumpsys)")/../../state/thermal"
  echo $(( $(cat $d/cpuinfo_max_freq) / 2 )) > $d/scaling_max_freq
  echo 3 > "$st/hal_status"
  sleep "$hold"
  cat $d/cpuinfo_max_freq > $d/scaling_max_freq
  echo 0 > "$st/hal_status"
fi
"""
ENGINE = sh_engine('n=6; ms=100; csv=""; m=""; hold=0', ('--throttle) hold="$2"; shift 2;;',), _THROTTLE, PROGRESS)


def _campaign(tmp_path: Path, serial: str, cooldown: str, axis: str) -> Path:
    return adb_campaign(tmp_path, ENGINE, name="steady", serial=serial, file="steady.yaml", keys=f"""\
        repeats: 1
        tokens: 6
        warmup_tokens: 1
        cooldown: {cooldown}
        timeout_s: 120
        axes:
          - {axis}
        """)


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*BENCH, *args], capture_output=True, text=True, timeout=600)


def test_a_strict_temperature_target_defers_a_hot_phones_runs_and_runs_them_once_it_cooled(tmp_path, phone):
    phone.profile.heat(88.5)  # before the campaign: the phone is hot and stays so
    p = _campaign(tmp_path, phone.serial, "{cpu_temp_max_c: 45, max_wait_s: 1, poll_s: 0.2, on_timeout: defer, "
                                          "max_deferrals: 1}", "{flag: --n-unused, values: [1]}")
    out = tmp_path / "bd"
    r = _bench("run", str(p), "--out", str(out))
    assert r.returncode != 0
    assert "2 run(s) deferred, not run hot: the device did not meet the cooldown condition (gave up after " in \
        r.stderr.replace("\n", " "), r.stderr
    assert "cpu 88.5 C > 45 C" in r.stderr
    folder = next(out.glob("*-steady"))
    m = load_manifest(folder)
    assert m.status.startswith("incomplete: 2 run(s) deferred, not run hot")
    assert all(not x.finished and len(x.deferrals) == 2 for x in m.runs)  # tried, to the end, tried, left
    assert all(d.cpu_temp_c == 88.5 and d.waited_s >= 1 for x in m.runs for d in x.deferrals)
    assert not any((folder / "runs").iterdir())  # no engine started
    problems = check_folder(folder).problems
    assert sum("lacks 1 run(s) because the device did not meet the cooldown condition" in x for x in problems) == 2

    phone.profile.cool()
    r = _bench("run", str(p), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "2 runs ok, 0 failed" in r.stdout and "2 deferred earlier (the device was hot)" in r.stderr
    m = load_manifest(folder)
    assert m.status == "complete" and all(x.status == "ok" and len(x.deferrals) == 2 for x in m.runs)
    assert all(x.entry_state.cpu_temp_c == 37.5 for x in m.runs)  # ran cool
    text = (folder / "findings.md").read_text()
    assert text.count("(deferred 2x: the device stayed hot)") == 2
    # every run there now (the loopback adbd has no getprop: its fingerprint's gaps are the only problem left)
    assert check_folder(folder).problems == ["provenance: device fingerprint lacks fingerprint, soc, android"]


def test_throttling_during_a_run_is_recorded_and_marked_next_to_its_cell(tmp_path, phone):
    p = _campaign(tmp_path, phone.serial, "{cpu_temp_max_c: 60, max_wait_s: 30, poll_s: 0.2, between_runs_s: 1}",
                  "{flag: --throttle, values: [6]}")
    out = tmp_path / "bd"
    r = _bench("run", str(p), "--out", str(out))
    assert r.returncode == 0, r.stderr
    folder = next(out.glob("*-steady"))
    m = load_manifest(folder)
    by = {x.cell: x for x in m.runs}
    base, hot = by[0], by[1]
    assert base.throttle is not None and not base.throttle.throttled
    t = hot.throttle
    assert t is not None and t.throttled, t
    assert t.capped == {"policy7": 0.5} and t.min_cap == 0.5 and t.max_thermal_status == 3
    assert 0 < t.throttled_s <= 60 and t.throttled_samples >= 1
    rested = [x.gate.rested_s for x in sorted(m.runs, key=lambda x: x.start)]
    assert rested[0] == 0.0 and 1.0 <= rested[1] < 60  # the fixed cool-down before the second run only
    assert phone.profile.freq(7)["scaling_max"] == 3_014_400 and phone.profile.thermal_status() == 0  # let go

    label = m.campaign.cells[1].label
    text = (folder / "findings.md").read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith("| ")]
    assert any(ln.startswith(f"| {label} † |") for ln in rows), rows
    assert not any(ln.startswith("| **base** †") for ln in rows)
    assert re.search(rf"^† {re.escape(label)}: throttled during {hot.run_id} \(policy7 capped at 50% of its "
                     rf"maximum, thermal status 3, for [0-9.]+ s\)$", text, re.MULTILINE), text
    assert f"- throttling: the device throttled during 1 run(s) ({hot.run_id}) of {label}" in text
    assert "the CPU frequency ceiling fell" not in text  # raised once, by the run's own record
    notes = check_folder(folder).notes
    assert f"the device throttled during run(s) {hot.run_id} (findings.md marks their cells)" in notes


def test_a_fleet_defers_only_its_hot_phones_runs_and_runs_them_again_once_it_cooled(tmp_path):
    """A compare fleet over two profiled phones behind a real adb server (tests/helpers/adb_fleet.py): the hot one's
    runs are deferred and left unrun, the cool one's run; cooled, `run` again runs only the deferred ones."""
    if not os.environ.get("BMOE_TEST_ADBD"):
        pytest.skip("needs BMOE_TEST_ADBD (set by tests/adbd/run-adb-tests.sh)")
    from tests.helpers.adb_fleet import Lab

    server, ports = 5061, {"hot": 15691, "cool": 15692}
    profiles = {x: DeviceProfile.create(tmp_path / x, PHONE) for x in ports}
    profiles["hot"].heat(88.5)
    lab = Lab()
    try:
        lab.start_server(server)
        for x, port in ports.items():
            lab.start_device(port, server, profiles[x].root)
        p = _campaign(tmp_path, "unused", "{cpu_temp_max_c: 45, max_wait_s: 1, poll_s: 0.2, on_timeout: defer, "
                                          "max_deferrals: 1}", "{flag: --n-unused, values: [1]}")
        targets = "".join(f'  - {{serial: "127.0.0.1:{port}", server: "127.0.0.1:{server}", label: {x}}}\n'
                          for x, port in ports.items())
        p.write_text(p.read_text().replace('target: {kind: adb, serial: "unused"}\n', "")
                     + "fleet: {use: compare, device_grace_s: 20}\ntargets:\n" + targets)
        out = tmp_path / "bd"
        r = _bench("run", str(p), "--out", str(out))
        assert r.returncode != 0 and "2 run(s) deferred, not run hot" in r.stderr.replace("\n", " "), r.stderr
        folder = next(out.glob("*-steady"))
        m = load_manifest(folder)
        cells = {c.index: c.device for c in m.campaign.cells}
        assert m.status.startswith("incomplete: 2 run(s) deferred, not run hot")
        assert sorted((cells[x.cell], x.status, len(x.deferrals)) for x in m.runs) == [
            ("cool", "ok", 0), ("cool", "ok", 0), ("hot", "pending", 2), ("hot", "pending", 2)]

        profiles["hot"].cool()
        r = _bench("run", str(p), "--out", str(out))
        assert r.returncode == 0, r.stderr
        m = load_manifest(folder)
        assert m.status == "complete" and all(x.status == "ok" and x.device == cells[x.cell] for x in m.runs)
        assert sorted(len(x.deferrals) for x in m.runs) == [0, 0, 2, 2]
    finally:
        lab.close()
