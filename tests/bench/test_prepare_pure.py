"""Device preparation's pure parts: the fastest cores from cpufreq's policies, the plan of changes for a device as
read, the campaign key's rules, and the journal read as untrusted (a hostile one refused before any of its values
could become a shell argument)."""

from __future__ import annotations

import json

import pytest

from harness.campaigns.prepared import plan_items
from harness.devices.cores import CpuPolicy, cpu_mask, fastest_cores, parse_cpus, parse_policies, policies_of
from harness.devices.prepare import Observed
from harness.errors import UserError
from harness.formats import prepared as fmt
from harness.formats.campaign import CampaignFile
from harness.formats.campaign_prepare import PrepareSpec

# a Snapdragon-8-Gen-2-like phone, as POLICY_SCRIPT prints it
PHONE = ("policy0|0 1 2 3|1804800|schedutil|schedutil performance powersave\n"
         "policy4|4 5 6|2419200|schedutil|schedutil performance powersave\n"
         "policy7|7|3014400|walt|walt performance\n")


def test_policies_are_parsed_and_bad_lines_left_out():
    pols = parse_policies(PHONE + "policyX|0|1|a|b\npolicy9|9-a|100|x|\npolicy8|8|fast|x|\n|||\n")
    assert [p.name for p in pols] == ["policy0", "policy4", "policy7"]
    assert pols[1] == CpuPolicy("policy4", (4, 5, 6), 2_419_200, "schedutil", ("schedutil", "performance",
                                                                               "powersave"))
    assert parse_policies("policy0|0-3,6|100|Perf;rm -rf /|x y\n")[0].governor is None  # not a governor's name
    assert parse_cpus("0-3,6") == (0, 1, 2, 3, 6) and parse_cpus("4 5 6") == (4, 5, 6)
    assert parse_cpus("3-1") is None and parse_cpus("99999") is None and parse_cpus("") is None


@pytest.mark.parametrize(("n", "want"), [(1, (7,)), (2, (4, 7)), (4, (4, 5, 6, 7)), (5, (0, 4, 5, 6, 7)),
                                         (8, tuple(range(8))), (12, tuple(range(8)))])
def test_fastest_cores_take_whole_policies_fastest_first(n, want):
    assert fastest_cores(parse_policies(PHONE), n) == want


def test_fastest_cores_ties_and_masks():
    # two policies at the same maximum: the higher cpus (the big cluster is last on phones) first
    pols = [CpuPolicy("policy0", (0, 1), 2_000_000, None), CpuPolicy("policy2", (2, 3), 2_000_000, None)]
    assert fastest_cores(pols, 2) == (2, 3)
    assert policies_of(parse_policies(PHONE), (4, 7)) == parse_policies(PHONE)[1:]
    assert cpu_mask((7,)) == "80" and cpu_mask((4, 5, 6, 7)) == "f0" and cpu_mask((0, 9)) == "201"
    with pytest.raises(ValueError):
        cpu_mask(())
    with pytest.raises(ValueError):
        fastest_cores(pols, 0)
    assert fmt.cpu_list([4, 5, 6, 7, 9, 11, 12]) == "4-7,9,11-12"


def _seen(**kw) -> Observed:
    base = dict(stay_on="0", awake=True, battery={"level": 80, "plugged": "usb"}, battery_frozen=False,
                policies=parse_policies(PHONE))
    return Observed(**{**base, **kw})


def test_the_plan_changes_only_what_differs():
    spec = PrepareSpec(screen="turn_off", charger="unplug", pin_cores=4, governor="performance")
    p = plan_items(spec, _seen(), "s1")
    assert [it.kind for it in p.items] == ["screen", "battery", "governor", "governor"]
    assert [(it.policy, it.original) for it in p.items if it.kind == "governor"] == [("policy4", "schedutil"),
                                                                                     ("policy7", "walt")]
    assert p.pin_cpus == (4, 5, 6, 7) and p.pin_policies == ["policy4", "policy7"] and p.notes == []
    # already asleep, already frozen, already performance: nothing to change, each said
    pols = [CpuPolicy("policy0", (0, 1), 2_000_000, "performance", ("performance",))]
    p = plan_items(spec, _seen(awake=False, battery_frozen=True, policies=pols), "s1")
    assert p.items == [] and p.notes == [
        "screen already off",
        "battery service already frozen by someone else (UPDATES STOPPED): charger left as it shows",
        "pin_cores 4: the device has 2 cores"]
    # stay awake: the setting's value before is kept, whatever it was (null: never set)
    p = plan_items(PrepareSpec(screen="stay_awake"), _seen(stay_on="null"), "s1")
    assert p.items[0].model_dump() == {"kind": "stay_on", "original": "null", "applied": "7"}
    # a governor the policy does not offer: left, said
    p = plan_items(PrepareSpec(governor="ondemand"), _seen(), "s1")
    assert p.items == [] and all("does not offer governor ondemand" in n for n in p.notes)


def test_the_plan_refuses_what_the_device_cannot_tell():
    with pytest.raises(UserError, match=r"adb device s1: prepare.charger needs `dumpsys battery`"):
        plan_items(PrepareSpec(charger="unplug"), _seen(battery=None), "s1")
    with pytest.raises(UserError, match=r"prepare.screen needs `settings get"):
        plan_items(PrepareSpec(screen="stay_awake"), _seen(stay_on=None), "s1")
    p = plan_items(PrepareSpec(pin_cores=2, governor="performance"), _seen(policies=[]), "s1")
    assert p.pin_cpus == () and p.items == [] and len(p.notes) == 2


def _campaign(**kw) -> list[str]:
    c = CampaignFile.model_validate({"name": "x", "model": {"path": "/m.gguf"}, **kw})
    return [msg for _, msg in c.relation_problems()]


def test_the_key_is_for_adb_devices_and_its_rules_hold():
    adb = {"target": {"kind": "adb"}, "engine": {"kind": "external", "path": "/e"}}
    assert _campaign(**adb, prepare={"screen": "turn_off", "charger": "unplug", "pin_cores": 4}) == []
    assert _campaign(prepare={"screen": "turn_off"}) == [
        "prepare applies to adb devices (target adb, or a fleet): remove it"]
    assert _campaign(prepare={}) == []  # nothing asked: nothing to refuse
    assert any("stay_awake keeps a device awake only while" in m
               for m in _campaign(**adb, prepare={"screen": "stay_awake", "charger": "unplug"}))
    assert any("battery_wait_s waits for battery_min_pct" in m
               for m in _campaign(**adb, prepare={"battery_wait_s": 5.0}))
    with pytest.raises(ValueError, match="not a cpufreq governor"):
        PrepareSpec(governor="perf; reboot")
    with pytest.raises(ValueError):
        PrepareSpec(screen="dim")


def _journal(**kw) -> dict:
    j = {"format": "bmoe-prepared", "version": 1, "serial": "127.0.0.1:15555", "server": "127.0.0.1:5037",
         "state": "applied", "created": "2026-12-05T06:00:00.000Z", "charger": "unplug", "charger_seen": "usb",
         "battery_level": 80, "governors": {"policy7": "walt"},
         "items": [{"kind": "stay_on", "original": "0", "applied": "7"},
                   {"kind": "battery", "original": "live", "applied": "unplugged"},
                   {"kind": "governor", "policy": "policy7", "original": "walt", "applied": "performance"}],
         "pin": {"cpus": [7], "mask": "80", "command": ["taskset", "80"], "policies": ["policy7"]}}
    return {**j, **kw}


def _write(tmp_path, obj, serial="127.0.0.1:15555"):
    p = tmp_path / fmt.DIR / fmt.file_name(serial)
    p.parent.mkdir(exist_ok=True)
    p.write_text(json.dumps(obj) if not isinstance(obj, str) else obj)
    return p


def test_a_journal_round_trips(tmp_path):
    p = _write(tmp_path, _journal())
    j = fmt.load(p)
    assert p.name == "127.0.0.1_15555.json" and fmt.journals(tmp_path) == [p]
    assert j.summary() == ("stay awake (stay_on 0 -> 7); on battery (dumpsys battery unplug); battery 80% at the "
                           "start; engine pinned to cpu 7 (taskset 80); governor policy7 walt -> performance [applied]")
    fmt.save(tmp_path, j)
    assert fmt.load(p) == j


@pytest.mark.parametrize(("change", "why"), [
    ({"items": [{"kind": "governor", "policy": "policy7/../../../../etc", "original": "walt", "applied": "x"}]},
     "not a cpufreq policy"),
    ({"items": [{"kind": "governor", "policy": "policy7", "original": "walt; reboot", "applied": "x"}]},
     "not a cpufreq governor"),
    ({"items": [{"kind": "stay_on", "original": "0 && reboot", "applied": "7"}]}, "stay_on_while_plugged_in"),
    ({"items": [{"kind": "shell", "command": "reboot"}]}, "items.0"),
    ({"items": [{"kind": "screen", "original": "asleep", "applied": "asleep"}]}, "items.0.screen.original"),
    ({"pin": {"cpus": [7], "mask": "80", "command": ["sh", "80"], "policies": []}}, "pin.command"),
    ({"pin": {"cpus": [7], "mask": "80", "command": ["taskset", "ff"], "policies": []}}, "is not taskset 80"),
    ({"server": "evil host:5037"}, "host:port"),
    ({"serial": "$(reboot)"}, "an adb serial"),
    ({"extra": 1}, "extra"),
    ({"version": 2}, "version"),
])
def test_a_hostile_journal_is_refused(tmp_path, change, why):
    p = _write(tmp_path, _journal(**change))
    with pytest.raises(UserError, match="not a device-preparation journal bmoe-bench wrote") as e:
        fmt.load(p)
    assert why in str(e.value) and "\n" not in str(e.value)


def test_a_journal_under_another_devices_name_or_not_json_is_refused(tmp_path):
    p = _write(tmp_path, _journal(), serial="other:1")
    with pytest.raises(UserError, match="names device 127.0.0.1:15555"):
        fmt.load(p)
    with pytest.raises(UserError, match="not valid JSON"):
        fmt.load(_write(tmp_path, "{", serial="x"))
    with pytest.raises(UserError, match="nested deeper"):
        fmt.load(_write(tmp_path, "[" * 200 + "]" * 200, serial="y"))


def test_a_journal_is_never_written_through_a_link(tmp_path):
    j = fmt.Journal.model_validate(_journal())
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / fmt.DIR).symlink_to(outside)
    with pytest.raises(UserError, match="a symbolic link"):
        fmt.save(folder, j)
    assert list(outside.iterdir()) == [] and fmt.journals(folder) == []
