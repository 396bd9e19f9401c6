"""Provenance that covers every device of a fleet, over real adbd devices on loopback (tests/adbd/run-adb-tests.sh
runs these; elsewhere they skip): three devices, each with its own tmpfs /data. Each device's fingerprint and
storage are recorded, read on that device; `check` holds every device to its record, so an edited record of the
second or third device fails it; findings state the verdict per device. On one device a ramfs mounted in its own
namespace (which refuses O_DIRECT; a campaign cannot stage there, its df shows no free space) gives the probe's
"no", found by the device's own dd."""

from __future__ import annotations

import json
import os
import textwrap
from io import StringIO

import pytest
from rich.console import Console

from harness.campaigns.runner import run_campaign
from harness.formats.manifest import load_manifest
from harness.report.build import build_report
from harness.report.checker import check_folder
from tests.helpers.adb_fleet import Lab, write_engine

pytestmark = [pytest.mark.adb]

SERVER = 5051
DEVS = {"p1": 15581, "p2": 15582, "p3": 15583}
LACKS = "fingerprint lacks fingerprint, soc, android"  # a Linux adbd has no getprop


@pytest.fixture(scope="module")
def lab():
    if not os.environ.get("BMOE_TEST_ADBD"):
        pytest.skip("needs BMOE_TEST_ADBD (set by tests/adbd/run-adb-tests.sh)")
    lab = Lab()
    try:
        lab.start_server(SERVER)
        for port in DEVS.values():
            lab.start_device(port, SERVER)
        yield lab
    finally:
        lab.close()


@pytest.fixture(scope="module")
def folder(lab, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fleetprov")
    os.environ["BMOE_HASH_CACHE"] = str(tmp / "hashes.json")
    model = tmp / "model.gguf"
    model.write_bytes(os.urandom(16384))
    targets = "".join(f'  - {{serial: "127.0.0.1:{port}", server: "127.0.0.1:{SERVER}", label: {label}}}\n'
                      for label, port in DEVS.items())
    p = tmp / "fleetprov.yaml"
    p.write_text(textwrap.dedent(f"""\
        name: fleetprov
        model: {{push_from: {model}}}
        engine: {{kind: external, push_from: {write_engine(tmp)}}}
        repeats: 2
        tokens: 4
        timeout_s: 60
        cooldown: {{max_wait_s: 5}}
        flags: {{--sleep: 0.1}}
        axes:
          - {{flag: --ms, values: [100, 50]}}
        fleet: {{use: compare, device_grace_s: 20}}
        targets:
        """) + targets)
    res = run_campaign(p, root=tmp / "out", console=Console(file=StringIO(), width=200))
    assert res.n_failed == 0
    return res.folder


def _edit(folder, change) -> None:
    p = folder / "manifest.json"
    m = json.loads(p.read_text())
    change(m)
    p.write_text(json.dumps(m, indent=1))


def test_each_device_records_its_own_fingerprint_and_storage(folder):
    m = load_manifest(folder)
    devs = m.provenance.devices
    assert list(devs) == list(DEVS)
    for label, d in devs.items():
        assert d.fingerprint.kind == "adb" and d.fingerprint.kernel == m.devices[label]["kernel"]
        s = d.storage
        assert (s.path, s.mount_point, s.kind, s.disk) == ("/data/local/tmp/bmoe", "/data", "ram", None)
        assert s.o_direct_how  # how it was found, on the device (dd iflag=direct)
        assert s.fs == "tmpfs" and s.size_mib == pytest.approx(128, abs=1)  # the lab's 128 MiB tmpfs, by its df
        assert s.o_direct in ("yes", "no")  # tmpfs takes O_DIRECT from Linux 6.6 on: the kernel's answer
    assert m.provenance.storage == devs["p1"].storage  # the first device's, where one target's goes


def test_o_direct_refused_is_found_by_the_devices_own_dd(lab, tmp_path):
    from harness.campaigns.provenance import target_storage
    from harness.targets.adb import AdbTarget

    t = AdbTarget(f"127.0.0.1:{DEVS['p3']}", port=SERVER)
    try:
        t.device.shell_ok("mkdir -p /data/local/tmp/ram && mount -t ramfs -o mode=0755 none /data/local/tmp/ram && "
                          "head -c 16384 /dev/urandom > /data/local/tmp/ram/m.gguf", what="mount a ramfs")
        s = target_storage(t, "/data/local/tmp/ram/m.gguf")
        assert (s.fs, s.kind, s.mount_point, s.o_direct) == ("ramfs", "ram", "/data/local/tmp/ram", "no")
        assert s.o_direct_how.startswith("`dd iflag=direct` on the model was refused:") and \
            "Invalid argument" in s.o_direct_how
        assert target_storage(t, "/data/local/tmp/bmoe/model.gguf").fs == "tmpfs"  # beside it, /data as it was
    finally:
        t.device.shell("umount /data/local/tmp/ram; rmdir /data/local/tmp/ram")
        t.close()


def test_check_holds_every_device_to_its_record(folder):
    assert check_folder(folder).problems == [f"provenance: device {d}: {LACKS}" for d in DEVS]
    _edit(folder, lambda m: m["provenance"]["devices"]["p3"]["fingerprint"].update(kernel="Linux 4.19 aarch64"))
    new = [p for p in check_folder(folder).problems if "lacks" not in p]
    assert len(new) == 1 and new[0].startswith("provenance: device p3: its fingerprint says kernel 'Linux 4.19 "
                                               "aarch64', its description 'Linux ")
    _edit(folder, lambda m: m["provenance"]["devices"]["p3"]["fingerprint"].update(kernel=m["devices"]["p3"]["kernel"]))
    ram = load_manifest(folder).devices["p2"]["mem_total_mib"]

    def second_elsewhere(m):
        m["provenance"]["devices"]["p2"]["fingerprint"]["mem_total_mib"] = ram / 4
        m["devices"]["p2"]["mem_total_mib"] = ram / 4
    _edit(folder, second_elsewhere)
    new = [p for p in check_folder(folder).problems if "lacks" not in p]
    p2_runs = [r.run_id for r in load_manifest(folder).runs if r.device == "p2"]
    assert len(new) == len(p2_runs) == 6  # its 3 cells (the base and the two --ms values) x 2 rounds
    assert all(f"on device p2: its entry state shows {ram:.0f} MiB of RAM, device p2 has {ram / 4:.0f} MiB" in p
               for p in new)


def test_findings_state_each_device_its_verdict_and_storage(folder):
    md = build_report(folder, with_plots=False).texts["findings.md"]
    verdict = md.split("## Verdict\n\n", 1)[1].split("\n## ", 1)[0]
    assert [ln.split("**")[1] for ln in verdict.split("\n\n") if ln.startswith("**On ")] == \
        [f"On {d}" for d in DEVS]
    assert "storage: the model is in RAM on p3 (tmpfs, `/data/local/tmp/bmoe`)" in md
    assert "  - **p3**: " in md and "    Storage: RAM (no storage device), tmpfs on `/data`" in md
    assert "### Across devices" in md and "x the same setting on p1 [95% CI]" in md
