"""A campaign's device preparation (`prepare:`) on real adbd devices carrying a device profile (tests/helpers/
device_profile.py): every item applied while the runs run, as the profile's snapshot sees it, and the device left as
it was found after a campaign that ended, was interrupted (Ctrl-C), or whose harness was killed (SIGKILL; then
`bmoe-bench devices --restore FOLDER`, or `bmoe-bench run` again). An unrooted phone's governor is recorded, not set;
a battery below the minimum refuses the start. Run by tests/adbd/run-adb-tests.sh; skipped elsewhere."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import textwrap
import threading
import time
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

from harness import interrupts
from harness.campaigns.runner import run_campaign
from harness.errors import UserError
from harness.formats import prepared as fmt
from harness.formats.manifest import load_manifest
from harness.report.build import write_report
from harness.targets.adb import AdbTarget
from tests.helpers.device_profile import DUO, DeviceProfile, ProfiledDevice, start_device
from tests.helpers.runner import BENCH, wait_for

pytestmark = [pytest.mark.adb]

_ports = itertools.count(15651)  # clear of test_device_profile (15601-) and the fleet lab (15571-15574)

# a POSIX sh engine: prints the cpus it may run on, writes a bmoe_metrics v2 CSV, then one progress line per
# token, --sleep S apart
ENGINE = r"""#!/bin/sh
n=4; csv=""; m=""; s=0
while [ $# -gt 0 ]; do
  case "$1" in
    -m) m="$2"; shift 2;;
    -n) n="$2"; shift 2;;
    --csv) csv="$2"; shift 2;;
    --sleep) s="$2"; shift 2;;
    --version) echo "sh-engine 1"; exit 0;;
    *) shift;;
  esac
done
[ -f "$m" ] || { echo "sh-engine: no model at $m" >&2; exit 2; }
grep Cpus_allowed_list /proc/self/status
{
  echo "# bmoe_metrics v2"; echo "# engine_version=sh-engine 1"
  echo "step,steps,wall_ms,read_bytes"
  i=0; while [ "$i" -lt "$n" ]; do i=$((i + 1)); echo "$i,$n,100,1048576"; done
  echo "# summary tokens=$n"
} > "$csv.part"
mv "$csv.part" "$csv"
i=0
while [ "$i" -lt "$n" ]; do
  i=$((i + 1)); sleep "$s"; echo "BMOE_PROGRESS {\"step\": $i, \"steps\": $n, \"wall_ms\": 100}"
done
"""

EVERYTHING = "{screen: turn_off, charger: unplug, battery_min_pct: 50, pin_cores: 1, governor: performance}"


@pytest.fixture
def device(tmp_path):
    """start(layout, rooted=True) -> a ProfiledDevice; stopped at the end."""
    if not os.environ.get("BMOE_TEST_ADBD"):
        pytest.skip("needs BMOE_TEST_ADBD (set by tests/adbd/run-adb-tests.sh)")
    made: list[ProfiledDevice] = []

    def start(layout=DUO, *, rooted: bool = True, level: int | None = None) -> ProfiledDevice:
        profile = DeviceProfile.create(tmp_path / f"p{len(made)}", layout)
        if level is not None:
            profile.set_battery(level=level)
        made.append(start_device(profile, next(_ports), rooted=rooted, data_mb=128))
        return made[-1]

    yield start
    for dev in made:
        dev.stop()


def _campaign(tmp_path: Path, serial: str, prepare: str, *, repeats: int = 1, sleep: str = "0") -> Path:
    """Two cells (the base and --x=1), `repeats` rounds."""
    eng = tmp_path / "sh-engine"
    eng.write_text(ENGINE)
    eng.chmod(0o755)
    model = tmp_path / "model.gguf"
    model.write_bytes(os.urandom(4096))
    p = tmp_path / "prep.yaml"
    p.write_text(textwrap.dedent(f"""\
        name: prep
        model: {{push_from: {model}}}
        target: {{kind: adb, serial: "{serial}"}}
        engine: {{kind: external, push_from: {eng}}}
        repeats: {repeats}
        tokens: 4
        flags: {{--sleep: "{sleep}"}}
        axes: [{{flag: --x, values: [1]}}]
        cooldown: {{max_wait_s: 0}}
        timeout_s: 120
        prepare: {prepare}
        """))
    return p


class Watching(AdbTarget):
    """A real AdbTarget that takes its profile's snapshot as each engine run starts."""

    def __init__(self, dev: ProfiledDevice):
        super().__init__(dev.serial)
        self.profile = dev.profile
        self.seen: list[dict] = []

    def run(self, argv, **kw):
        if "--csv" in argv:
            self.seen.append(self.profile.snapshot())
        return super().run(argv, **kw)


class Interrupting(Watching):
    """Ctrl-C (SIGINT to this process) a second into the first run, however long the start took."""

    def run(self, argv, **kw):
        if "--csv" in argv and not self.seen:
            threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        return super().run(argv, **kw)


def _journal(folder: Path, serial: str) -> fmt.Journal:
    return fmt.load(fmt.journal_path(folder, serial))


def test_every_item_is_applied_during_the_runs_and_put_back_after(tmp_path, device):
    dev = device()
    before = dev.profile.snapshot()
    assert before["screen_on"] and not before["battery_frozen"] and before["governors"] == {
        "policy0": "schedutil", "policy1": "schedutil"}
    out = StringIO()
    target = Watching(dev)
    try:
        res = run_campaign(_campaign(tmp_path, dev.serial, EVERYTHING), root=tmp_path / "bd",
                           console=Console(file=out, width=200), target=target)
    finally:
        target.close()
    assert (res.n_ok, res.n_failed) == (2, 0)
    # during every run: the screen off, on battery as the service shows it, the big core's governor performance
    assert len(target.seen) == 2
    for s in target.seen:
        assert s["screen_on"] is False and s["battery_frozen"] is True
        assert s["battery_shown"]["usb"] == "false" and s["battery_shown"]["ac"] == "false"
        assert s["governors"] == {"policy0": "schedutil", "policy1": "performance"}  # the pinned core's policy only
    # the engine ran on the fastest core, and each run records it
    m = load_manifest(res.folder)
    for r in m.runs:
        assert r.argv[:2] == ["taskset", "2"] and r.argv[2].startswith("/data/local/tmp/")
        assert "Cpus_allowed_list:\t1\n" in (res.folder / "runs" / r.run_id / "engine.log").read_text()
    # after: as it was found, and the journal says what was done
    assert dev.profile.snapshot() == before
    j = _journal(res.folder, dev.serial)
    assert j.state == "restored" and j.charger == "unplug" and j.charger_seen == "usb" and j.battery_level == 80
    assert [it.kind for it in j.items] == ["screen", "battery", "governor"]
    assert j.pin.model_dump() == {"cpus": [1], "mask": "2", "command": ["taskset", "2"], "policies": ["policy1"]}
    assert m.campaign.prepare.pin_cores == 1  # part of the plan: a folder resumes only with the same preparation
    said = " ".join(out.getvalue().split())
    assert f"{dev.serial}: prepared: screen off; on battery (dumpsys battery unplug)" in said
    write_report(res.folder)
    md = (res.folder / "findings.md").read_text()
    assert f"**Device preparation**, {dev.serial}: screen off; on battery (dumpsys battery unplug); battery 80% " \
           f"at the start; engine pinned to cpu 1 (taskset 2); governor policy1 schedutil -> performance " \
           f"[restored]" in md
    r = subprocess.run([*BENCH, "check", str(res.folder)], capture_output=True, text=True, timeout=120)
    # the journal is no stray file to the folder's check (a Linux adbd has no Android fingerprint: its one problem)
    said = " ".join((r.stdout + r.stderr).split())
    assert "provenance: device fingerprint lacks fingerprint, soc, android" in said and "prepared" not in said


def test_stay_awake_and_a_charger_left_plugged_in(tmp_path, device):
    dev = device()
    before = dev.profile.snapshot()
    target = Watching(dev)
    try:
        res = run_campaign(_campaign(tmp_path, dev.serial, "{screen: stay_awake, charger: leave}"),
                           root=tmp_path / "bd", console=Console(file=StringIO()), target=target)
    finally:
        target.close()
    assert res.n_ok == 2
    assert target.seen[0]["stay_on"] == 7 and target.seen[0]["battery_frozen"] is False
    assert dev.profile.snapshot() == before and before["stay_on"] == 0
    j = _journal(res.folder, dev.serial)
    assert j.charger == "leave" and j.charger_seen == "usb" and j.pin is None
    assert "charger left as it was (usb)" in j.summary()


def test_an_unrooted_phone_keeps_its_governor_recorded_and_the_campaign_runs(tmp_path, device):
    dev = device(rooted=False)
    before = dev.profile.snapshot()
    out = StringIO()
    target = Watching(dev)
    try:
        res = run_campaign(_campaign(tmp_path, dev.serial, EVERYTHING), root=tmp_path / "bd",
                           console=Console(file=out, width=300), target=target)
    finally:
        target.close()
    assert res.n_ok == 2
    lines = [x for x in out.getvalue().splitlines() if "could not be set" in x]
    assert lines == [f"{dev.serial}: governor performance could not be set (not root?); the governor in force is "
                     f"recorded: policy1 schedutil"]
    assert target.seen[0]["governors"]["policy1"] == "schedutil" and target.seen[0]["screen_on"] is False
    j = _journal(res.folder, dev.serial)
    assert [it.kind for it in j.items] == ["screen", "battery"] and j.state == "restored"
    assert j.governors == {"policy0": "schedutil", "policy1": "schedutil"}
    assert j.governor_refused == "governor performance could not be set (not root?): policy1 schedutil in force"
    assert dev.profile.snapshot() == before


def test_a_battery_below_the_minimum_refuses_the_start_in_one_line(tmp_path, device):
    dev = device(level=30)
    before = dev.profile.snapshot()
    with pytest.raises(UserError) as e:
        run_campaign(_campaign(tmp_path, dev.serial, EVERYTHING), root=tmp_path / "bd",
                     console=Console(file=StringIO()))
    assert str(e.value) == (f"adb device {dev.serial}: battery at 30%, below prepare.battery_min_pct (50%): charge "
                            f"it, or lower the minimum")
    assert dev.profile.snapshot() == before
    assert not list((tmp_path / "bd").glob("*/prepared/*.json"))  # nothing was changed, nothing journalled


def test_a_charging_battery_is_waited_for(tmp_path, device):
    dev = device(level=40)
    out = StringIO()
    charged = threading.Timer(2.0, lambda: dev.profile.set_battery(level=60))  # the charger at work
    charged.start()
    try:
        res = run_campaign(_campaign(tmp_path, dev.serial, "{battery_min_pct: 50, battery_wait_s: 120}"),
                           root=tmp_path / "bd", console=Console(file=out, width=300))
    finally:
        charged.cancel()
    assert res.n_ok == 2
    assert f"{dev.serial}: battery at 40%, waiting up to 120 s for 50% (prepare.battery_min_pct)" in out.getvalue()
    assert _journal(res.folder, dev.serial).battery_level == 60


def test_ctrl_c_mid_campaign_puts_the_device_back(tmp_path, device):
    dev = device()
    before = dev.profile.snapshot()
    p = _campaign(tmp_path, dev.serial, EVERYTHING, repeats=6, sleep="0.5")
    target = Interrupting(dev)
    restore = interrupts.install()  # as every bmoe-bench command does (tests/helpers/sigint.py says why)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_campaign(p, root=tmp_path / "bd", console=Console(file=StringIO()), target=target)
    finally:
        restore()
        target.close()
    assert target.seen and target.seen[0] != before  # it was interrupted while prepared
    assert dev.profile.snapshot() == before
    folder = next((tmp_path / "bd").iterdir())
    assert load_manifest(folder).status == "interrupted" and _journal(folder, dev.serial).state == "restored"


def _killed_mid_campaign(tmp_path: Path, dev: ProfiledDevice, p: Path, root: Path) -> Path:
    """bmoe-bench run in a process of its own, SIGKILLed once its first run is under way: the campaign's folder."""
    proc = subprocess.Popen([*BENCH, "run", str(p), "--out", str(root), "--no-report"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        folder = wait_for(lambda: next(iter(root.glob("*-prep")), None) if root.is_dir() else None, timeout=120)
        jp = fmt.journal_path(folder, dev.serial)
        wait_for(lambda: jp.is_file() and json.loads(jp.read_text())["state"] == "applied", timeout=120)
        time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return folder


def test_a_killed_harness_is_put_right_by_devices_restore(tmp_path, device):
    dev = device()
    before = dev.profile.snapshot()
    p = _campaign(tmp_path, dev.serial, EVERYTHING, repeats=6, sleep="0.5")
    folder = _killed_mid_campaign(tmp_path, dev, p, tmp_path / "bd")
    left = dev.profile.snapshot()
    assert left != before and left["screen_on"] is False and left["governors"]["policy1"] == "performance"
    left_note = f"device {dev.serial} was left prepared (applied, not restored)"
    r = subprocess.run([*BENCH, "check", str(folder)], capture_output=True, text=True, timeout=120)
    assert left_note in " ".join((r.stdout + r.stderr).split())  # check says so, and how to put it back
    r = subprocess.run([*BENCH, "devices", "--restore", str(folder)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"{dev.serial}: restored (screen off; on battery" in " ".join(r.stdout.split())
    assert dev.profile.snapshot() == before and _journal(folder, dev.serial).state == "restored"
    r = subprocess.run([*BENCH, "check", str(folder)], capture_output=True, text=True, timeout=120)
    assert "left prepared" not in r.stdout + r.stderr
    # again: idempotent, nothing left to do
    r = subprocess.run([*BENCH, "devices", "--restore", str(folder)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and f"{dev.serial}: already restored" in r.stdout
    assert dev.profile.snapshot() == before


def test_a_killed_harness_is_put_right_by_running_again(tmp_path, device):
    dev = device()
    before = dev.profile.snapshot()
    p = _campaign(tmp_path, dev.serial, EVERYTHING, repeats=3, sleep="0.5")
    folder = _killed_mid_campaign(tmp_path, dev, p, tmp_path / "bd")
    assert dev.profile.snapshot() != before
    r = subprocess.run([*BENCH, "run", str(p), "--out", str(tmp_path / "bd"), "--no-report"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    err = " ".join(r.stderr.split())
    assert f"{dev.serial}: restoring what an earlier session left changed" in err
    assert err.index("restoring what an earlier") < err.index(f"{dev.serial}: prepared:")  # put back, then again
    assert load_manifest(folder).status == "complete"
    assert dev.profile.snapshot() == before and _journal(folder, dev.serial).state == "restored"


def test_a_hostile_journal_is_refused_before_anything_runs_on_the_device(tmp_path, device):
    dev = device()
    before = dev.profile.snapshot()
    folder = tmp_path / "f"
    (folder / fmt.DIR).mkdir(parents=True)
    bad = {"format": "bmoe-prepared", "version": 1, "serial": dev.serial, "server": "127.0.0.1:5037",
           "state": "applied", "created": "2026-12-05T06:00:00.000Z", "charger": "leave",
           "items": [{"kind": "governor", "policy": "policy1", "original": "x; input keyevent KEYCODE_SLEEP",
                      "applied": "performance"}]}
    (folder / fmt.DIR / fmt.file_name(dev.serial)).write_text(json.dumps(bad))
    r = subprocess.run([*BENCH, "devices", "--restore", str(folder)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stdout.splitlines() == [
        f"{folder / fmt.DIR / fmt.file_name(dev.serial)}: not a device-preparation journal bmoe-bench wrote "
        f"(items.0.governor.original: Value error, 'x; input keyevent KEYCODE_SLEEP' is not a cpufreq "
        f"governor's name); restore that device by hand"]
    assert dev.profile.snapshot() == before


def test_a_fleet_prepares_and_restores_each_device(tmp_path, device):
    rooted, unrooted = device(), device(rooted=False)
    before = {d.serial: d.profile.snapshot() for d in (rooted, unrooted)}
    p = _campaign(tmp_path, rooted.serial, EVERYTHING)
    text = p.read_text().replace(f'target: {{kind: adb, serial: "{rooted.serial}"}}\n',
                                 f'targets: [{{serial: "{rooted.serial}", label: a}}, '
                                 f'{{serial: "{unrooted.serial}", label: b}}]\n')
    p.write_text(text)
    made: dict[str, Watching] = {}

    def make(d) -> Watching:
        made[d.serial] = Watching(rooted if d.serial == rooted.serial else unrooted)
        return made[d.serial]

    out = StringIO()
    try:
        res = run_campaign(p, root=tmp_path / "bd", console=Console(file=out, width=300), fleet_target=make)
    finally:
        for t in made.values():
            t.close()
    assert (res.n_ok, res.n_failed) == (4, 0)
    assert [s["governors"]["policy1"] for s in made[rooted.serial].seen] == ["performance"] * 2
    assert [s["governors"]["policy1"] for s in made[unrooted.serial].seen] == ["schedutil"] * 2
    assert all(not s["screen_on"] and s["battery_frozen"] for t in made.values() for s in t.seen)
    assert [x for x in out.getvalue().splitlines() if "could not be set" in x] == [
        f"{unrooted.serial}: governor performance could not be set (not root?); the governor in force is recorded: "
        f"policy1 schedutil"]
    for d in (rooted, unrooted):
        assert d.profile.snapshot() == before[d.serial]
        assert _journal(res.folder, d.serial).state == "restored"
    assert all(r.argv[:2] == ["taskset", "2"] for r in load_manifest(res.folder).runs)
