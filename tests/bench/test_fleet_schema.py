"""A fleet in the campaign file (`targets:`, `fleet:`): checked like the rest (file:line, `--set`), and the
plan over its devices (compare: the device an axis; spread: the matrix unchanged)."""

from __future__ import annotations

import textwrap

import pytest

from harness.campaigns.fleet.devices import FleetDevice, fleet_plan, listed_devices, matches, owner_of
from harness.campaigns.runner import plan_record
from harness.campaigns.validate import plan_campaign
from harness.campaigns.yamlsrc import CampaignError
from harness.formats.campaign_fleet import parse_server
from harness.formats.manifest import plan_hash

FLEET = """\
name: f
model: {path: /data/local/tmp/m.gguf}
engine: {kind: external, path: /data/local/tmp/eng}
repeats: 2
tokens: 4
axes:
  - {flag: --x, values: [1]}
targets:
  - {serial: R5CT1, server: "lab1:5037", label: s23-a}
  - {serial: R5CT2, server: "lab2:5037"}
  - {serial: emulator-5554}
fleet: {use: compare, device_grace_s: 60}
"""


def _write(tmp_path, text):
    p = tmp_path / "f.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def errors(p, *sets):
    with pytest.raises(CampaignError) as ei:
        plan_campaign(p, overrides=sets)
    return ei.value.lines


def test_targets_load_as_adb_devices_with_labels(tmp_path):
    plan = plan_campaign(_write(tmp_path, FLEET))
    c = plan.campaign
    assert c.target.kind == "adb"  # a fleet's target kind, without a target: key
    assert [d.label for d in listed_devices(plan)] == ["s23-a", "R5CT2@lab2:5037", "emulator-5554@127.0.0.1:5037"]
    assert listed_devices(plan)[1] == FleetDevice("R5CT2@lab2:5037", "R5CT2", "lab2", 5037)
    assert c.fleet.device_grace_s == 60 and c.fleet.use == "compare"


def test_compare_makes_the_device_an_axis(tmp_path):
    plan = plan_campaign(_write(tmp_path, FLEET))
    devs = listed_devices(plan)
    fp = fleet_plan(plan, devs)
    assert [(x.label, x.device, x.varied) for x in fp.cells] == [
        ("s23-a base", "s23-a", {}), ("s23-a --x=1", "s23-a", {"--x": 1}),
        ("R5CT2@lab2:5037 base", "R5CT2@lab2:5037", {"device": "R5CT2@lab2:5037"}),
        ("R5CT2@lab2:5037 --x=1", "R5CT2@lab2:5037", {"--x": 1, "device": "R5CT2@lab2:5037"}),
        ("emulator-5554@127.0.0.1:5037 base", "emulator-5554@127.0.0.1:5037",
         {"device": "emulator-5554@127.0.0.1:5037"}),
        ("emulator-5554@127.0.0.1:5037 --x=1", "emulator-5554@127.0.0.1:5037",
         {"--x": 1, "device": "emulator-5554@127.0.0.1:5037"})]
    assert len(fp.runs) == 12  # the whole matrix, twice, on each of three devices
    owner = owner_of(fp)
    assert [owner[r.cell] for r in fp.runs[:6]] == [d.label for d in devs for _ in range(2)]
    rec = plan_record(fp)
    assert rec.fleet.use == "compare" and rec.fleet.devices == [d.label for d in devs]
    assert [c.device for c in rec.cells][:2] == ["s23-a", "s23-a"]
    # another device list is another plan (a folder resumes over the devices it started with)
    assert plan_hash(rec) != plan_hash(plan_record(fleet_plan(plan, devs[:2])))


def test_spread_keeps_the_matrix_and_binds_no_run(tmp_path):
    plan = plan_campaign(_write(tmp_path, FLEET), overrides=("fleet.use=spread",))
    fp = fleet_plan(plan, listed_devices(plan))
    assert [x.label for x in fp.cells] == ["base", "--x=1"] and len(fp.runs) == 4
    assert owner_of(fp) is None and fp.fleet.use == "spread"
    assert "device" not in plan_record(fp).dump()["cells"][0]


def test_set_reaches_into_the_fleet(tmp_path):
    p = _write(tmp_path, FLEET)
    plan = plan_campaign(p, overrides=("targets.1.server=lab3:5038", "fleet.device_grace_s=5"))
    assert listed_devices(plan)[1].label == "R5CT2@lab3:5038" and plan.campaign.fleet.device_grace_s == 5
    assert errors(p, "targets.0.server=lab1") == [
        "--set targets.0.server=lab1: targets[0].server 'lab1' is not host:port (an adb server, e.g. 127.0.0.1:5037 "
        "or lab1:5037)"]


TWICE = '  - {serial: R5CT1, server: "lab1:5037", label: s23-a}\n'


def test_fleet_errors_name_file_and_line(tmp_path):
    bad = FLEET.replace('server: "lab1:5037"', 'server: "lab1:99999"').replace("use: compare", "use: shard")
    p = _write(tmp_path, bad)
    assert errors(p) == [
        f"{p}:9: targets[0].server 'lab1:99999': port 99999 is not 1-65535",
        f"{p}:12: fleet.use must be one of compare, spread, got 'shard'"]
    p = _write(tmp_path, FLEET.replace("  - {serial: emulator-5554}\n", TWICE))
    assert errors(p) == [f"{p}:11: targets: s23-a is listed twice (labels must differ)"]


def test_fleet_rules_between_keys(tmp_path):
    p = _write(tmp_path, FLEET + "target: local\nprecision: {ratio_half_width: 0.1}\n")
    lines = errors(p)
    assert any("a fleet runs on adb devices: remove target" in x and f"{p}:13" in x for x in lines)
    assert any("precision is not supported on a fleet yet" in x for x in lines)
    p = _write(tmp_path, FLEET.replace("fleet: {use: compare, device_grace_s: 60}",
                                       "fleet: {servers: ['lab1:5037'], match: {model: SM-S911B}}"))
    assert errors(p) == [f"{p}:12: give either targets (a list of devices) or fleet.servers (a selector), not both"]
    p = _write(tmp_path, FLEET.split("targets:")[0] + "fleet: {use: spread}\n")
    assert errors(p) == [f"{p}:8: a fleet needs its devices: targets: [{{serial, server}}] or fleet.servers"]


def test_selector_match():
    phone = {"model": "SM-S911B", "mem_total_mib": 7.4 * 1024}
    assert matches(phone, "SM-S911B", 7) and not matches(phone, "SM-S911B", 8) and not matches(phone, "Pixel 8", None)
    assert not matches({"model": None, "mem_total_mib": None}, None, 1) and matches({}, None, None)


def test_server_addresses():
    assert parse_server("lab1:5037") == ("lab1", 5037) and parse_server("[::1]:5037") == ("::1", 5037)
    for bad in ("lab1", ":5037", "lab1:0", "lab 1:5037"):
        with pytest.raises(ValueError):
            parse_server(bad)
