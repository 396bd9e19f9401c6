"""`bmoe-bench check` on a fleet folder checks every device, not only the first: a copy of the committed four-device
loopback campaign (bench-data/2026-12-03-fleet-loopback) with one of its later devices' records edited fails, naming
that device; so does a run whose entry state is not of the device its record names. The pure parts
(harness.report.check_devices) on their own too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.formats.manifest import DeviceFingerprint
from harness.report.check_devices import fingerprint_of, gaps
from harness.report.checker import check_folder

FLEET = Path(__file__).resolve().parents[2] / "bench-data" / "2026-12-03-fleet-loopback"
STORAGE = {"path": "/data/local/tmp/bmoe", "kind": "ram", "fs": "tmpfs", "mount_point": "/data",
           "o_direct": "yes", "o_direct_how": "a 4 KiB read of the model with `dd iflag=direct` succeeded"}


@pytest.fixture
def folder(tmp_path) -> Path:
    d = tmp_path / FLEET.name
    shutil.copytree(FLEET, d)
    return d


def edit(folder: Path, change) -> None:
    p = folder / "manifest.json"
    m = json.loads(p.read_text())
    change(m)
    p.write_text(json.dumps(m, indent=1))


def with_device_provenance(m: dict) -> None:
    """The folder as a campaign records it now: each device's fingerprint and storage in provenance.devices."""
    m["provenance"]["devices"] = {
        label: {"fingerprint": fingerprint_of(desc).model_dump(mode="json", exclude_none=True), "storage": STORAGE}
        for label, desc in m["devices"].items()}


def problems(folder: Path) -> list[str]:
    """The check's problems, less acknowledged.txt's lines that no longer occur (the edit removed their problem)."""
    return [p for p in check_folder(folder).problems if not p.startswith("acknowledged.txt:")]


def test_the_committed_fleet_folder_passes(folder):
    res = check_folder(folder)
    assert res.ok, res.problems
    assert any("fingerprint is read from its description" in n for n in res.notes)  # a folder from before them


def test_a_later_devices_state_edited_is_caught(folder):
    edit(folder, lambda m: m["devices"]["lo-b1"].update(mem_total_mib=8000.0))  # the third device
    p = problems(folder)
    assert p and all("lo-b1" in x for x in p)
    runs = json.loads((folder / "manifest.json").read_text())["runs"]
    ran = [r["run_id"] for r in runs if r.get("device") == "lo-b1"]
    assert {x.split()[1] for x in p} == set(ran)  # every run on it: its entry state shows 24105 MiB
    assert "entry state shows 24105 MiB of RAM, device lo-b1 has 8000 MiB" in p[0]


def test_a_later_devices_fingerprint_cut_is_caught(folder):
    edit(folder, lambda m: m["devices"]["lo-a2"].pop("mem_total_mib"))  # the second device
    assert problems(folder) == ["provenance: device lo-a2: fingerprint lacks fingerprint, soc, android, mem_total_mib"]


def test_recorded_device_provenance_passes_and_each_device_is_held_to_it(folder):
    edit(folder, with_device_provenance)
    res = check_folder(folder)
    assert res.ok, res.problems
    assert not any("from before provenance.devices" in n for n in res.notes)

    edit(folder, lambda m: m["provenance"]["devices"]["lo-b2"]["fingerprint"].update(kernel="Linux 5.10 aarch64"))
    assert problems(folder) == [
        "provenance: device lo-b2: its fingerprint says kernel 'Linux 5.10 aarch64', its description "
        "'Linux 6.18.44-fc-v1045 x86_64' (the device changed since it was first opened, or a record was edited)"]


def test_a_device_without_its_fingerprint_or_storage_is_caught(folder):
    def drop(m):
        with_device_provenance(m)
        del m["provenance"]["devices"]["lo-a2"]
        m["provenance"]["devices"]["lo-b1"].pop("storage")
    edit(folder, drop)
    assert problems(folder) == ["provenance: device lo-a2: no fingerprint recorded (provenance.devices)",
                                "provenance: device lo-b1: no storage recorded"]


def test_a_run_recorded_on_another_device_than_it_ran_on_is_caught(folder):
    def move(m):
        with_device_provenance(m)
        m["provenance"]["devices"]["lo-b2"]["fingerprint"]["mem_total_mib"] = 3800.0  # a 4 GB phone
        m["devices"]["lo-b2"]["mem_total_mib"] = 3800.0
    edit(folder, move)
    p = problems(folder)
    assert p and all(x.startswith("run ") and "on device lo-b2: its entry state shows 24105 MiB" in x for x in p)


def test_a_run_on_an_undescribed_device_is_caught(folder):
    edit(folder, lambda m: m["devices"].pop("lo-b2"))
    assert problems(folder) == ["device lo-b2: runs ran on it but its description is not recorded (manifest devices)"]


def test_fingerprint_from_a_description():
    fp = fingerprint_of({"kind": "adb", "fingerprint": "google/husky/husky:14/AP1A/1:user/release-keys",
                         "platform": "zuma", "android_release": "14", "hardware": " AArch64", "kernel": "Linux 6.1",
                         "mem_total_mib": 11721.3, "cpus": 9})
    assert fp == DeviceFingerprint(kind="adb", fingerprint="google/husky/husky:14/AP1A/1:user/release-keys",
                                   soc="zuma", android="14", cpu_model=" AArch64", kernel="Linux 6.1",
                                   mem_total_mib=11721.3)
    assert gaps(fp) == []
    odd = fingerprint_of({"kind": "adb", "mem_total_mib": "lots", "fingerprint": ["x"], "kernel": True})
    assert odd.mem_total_mib is None and odd.fingerprint is None and odd.kernel is None  # untrusted values dropped
    assert gaps(odd) == ["fingerprint", "soc", "android", "mem_total_mib"]
