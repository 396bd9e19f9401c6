"""Fleet campaigns over real adbd devices behind real adb servers on loopback (tests/adbd/run-adb-tests.sh
runs these inside a private network namespace; anywhere else they skip): four devices, two servers, each
device its own /data. Compare and spread end to end; a device killed mid-run, gone for good and resumed
later, or back within the grace time; a server stopped mid-campaign; a server unreachable at the start
(never replaced by a local one); `bmoe-bench devices --server`."""

from __future__ import annotations

import os
import subprocess
import textwrap
import threading
import time
from datetime import datetime
from io import StringIO

import pytest
from rich.console import Console

from harness.campaigns.runner import run_campaign
from harness.errors import UserError
from harness.formats.manifest import load_manifest, raw_file_changes
from harness.targets.adb import AdbTarget
from tests.helpers.adb_fleet import Lab, listening, write_engine

pytestmark = [pytest.mark.adb]

S1, S2 = 5041, 5042  # two adb servers
DEVS = {"a1": (15571, S1), "a2": (15572, S1), "b1": (15573, S2), "b2": (15574, S2)}
DOWN = 5049  # no server here


@pytest.fixture(scope="module")
def lab():
    if not os.environ.get("BMOE_TEST_ADBD"):
        pytest.skip("needs BMOE_TEST_ADBD (set by tests/adbd/run-adb-tests.sh)")
    lab = Lab()
    try:
        lab.start_server(S1)
        lab.start_server(S2)
        for port, server in DEVS.values():
            lab.start_device(port, server)
        yield lab
    finally:
        lab.close()


def restore(lab: Lab) -> None:
    """Every server and device of DEVS running and attached again (after a test killed some)."""
    for s in (S1, S2):
        if s not in lab.servers:
            lab.start_server(s)
    for port, server in DEVS.values():
        if port not in lab.devices:
            lab.start_device(port, server)
        else:
            lab.connect(port)


def campaign(tmp_path, name: str, labels: list[str], *, use: str = "compare", grace: float = 20, repeats: int = 2,
             extra_targets: str = "") -> object:
    eng = write_engine(tmp_path)
    model = tmp_path / "model.gguf"
    model.write_bytes(os.urandom(8192))
    targets = "".join(f'  - {{serial: "127.0.0.1:{DEVS[x][0]}", server: "127.0.0.1:{DEVS[x][1]}", label: {x}}}\n'
                      for x in labels) + extra_targets
    p = tmp_path / f"{name}.yaml"
    p.write_text(textwrap.dedent(f"""\
        name: {name}
        model: {{push_from: {model}}}
        engine: {{kind: external, push_from: {eng}}}
        repeats: {repeats}
        tokens: 4
        timeout_s: 60
        cooldown: {{max_wait_s: 5}}
        flags: {{--sleep: 0.4}}
        axes:
          - {{flag: --ms, values: [200]}}
        fleet: {{use: {use}, device_grace_s: {grace}}}
        targets:
        """) + targets)
    return p


def run(p, root, console=None, **kw):
    console = console or Console(file=StringIO(), width=200)
    return run_campaign(p, root=root, console=console, **kw), console


def _t(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def most_at_once(runs) -> int:
    """The most runs in progress at one moment (from their outcomes' start and end)."""
    marks = sorted([(_t(r.start), 1) for r in runs] + [(_t(r.end), -1) for r in runs], key=lambda x: (x[0], x[1]))
    now = best = 0
    for _, d in marks:
        now += d
        best = max(best, now)
    return best


def kill_when_running(root, name: str, cells: list[int], action, after_s: float = 0.8) -> threading.Thread:
    """Call action() `after_s` seconds after a run of one of these cells has started (its temporary folder)."""
    def watch():
        t0 = time.monotonic()
        while time.monotonic() - t0 < 120:
            if any(any(root.glob(f"*-{name}/runs/.r*-c{c:02d}.*.tmp")) for c in cells):
                time.sleep(after_s)
                action()
                return
            time.sleep(0.02)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def test_compare_runs_the_whole_matrix_on_every_device_at_once(lab, tmp_path):
    restore(lab)
    res, _ = run(campaign(tmp_path, "cmp", list(DEVS)), tmp_path / "bd")
    assert (res.n_ok, res.n_failed, res.n_not_run) == (16, 0, 0)
    m = load_manifest(res.folder)
    assert m.status == "complete" and m.campaign.fleet.devices == list(DEVS)
    cells = {c.index: c for c in m.campaign.cells}
    assert [(c.device, c.varied) for c in m.campaign.cells[:3]] == [("a1", {}), ("a1", {"--ms": 200}),
                                                                     ("a2", {"device": "a2"})]
    for r in m.runs:
        assert r.device == cells[r.cell].device and r.status == "ok" and r.tokens == 4
    assert set(m.devices) == set(DEVS)
    assert m.devices["b2"]["serial"] == "127.0.0.1:15574" and m.devices["b2"]["server"] == f"127.0.0.1:{S2}"
    assert most_at_once(m.runs) >= 3  # one worker per device, all at once (4 on an idle machine)
    assert raw_file_changes(res.folder, m) == []


def test_spread_shares_one_matrix_among_the_devices(lab, tmp_path):
    restore(lab)
    res, _ = run(campaign(tmp_path, "spr", list(DEVS), use="spread", repeats=6), tmp_path / "bd")
    assert (res.n_ok, res.n_failed, res.n_not_run) == (12, 0, 0)
    m = load_manifest(res.folder)
    assert [c.label for c in m.campaign.cells] == ["base", "--ms=200"]  # the matrix, unchanged
    used = [r.device for r in m.runs]
    assert set(used) <= set(DEVS) and len(set(used)) >= 3
    assert most_at_once(m.runs) >= 3


def test_device_lost_mid_run_fails_that_run_and_its_queue_resumes_later(lab, tmp_path):
    restore(lab)
    p = campaign(tmp_path, "lost", ["a1", "a2", "b1"], grace=2)
    root = tmp_path / "bd"
    port = DEVS["b1"][0]
    killer = kill_when_running(root, "lost", [4, 5], lambda: lab.kill_device(port))
    res, out = run(p, root)
    killer.join()
    m = load_manifest(res.folder)
    b1 = [r for r in m.runs if r.cell in (4, 5)]
    failed = [r for r in b1 if r.status == "failed"]
    assert len(failed) == 1 and failed[0].reason.startswith("device gone"), failed
    assert failed[0].device == "b1"
    assert res.n_not_run == 3 and [r.status for r in b1].count("pending") == 3
    assert all(r.status == "ok" for r in m.runs if r.cell < 4)  # the others finished
    assert m.status.startswith("incomplete: 3 run(s) not run") and "b1" in m.status
    assert "b1: lost" in out.file.getvalue()
    before = {r.run_id: r.sha256 for r in m.runs if r.finished}
    lab.start_device(port, DEVS["b1"][1])  # back (with an empty /data: staged again)
    made = {}

    def target(d):
        made[d.label] = AdbTarget(d.serial, host=d.host, port=d.port)
        return made[d.label]

    res2, _ = run(p, root, fleet_target=target)
    # staged once per device: the files a1 and a2 kept are not pushed again (same sha256); b1 lost its /data
    assert [x for _, x in made["a1"].stage_log] == ["unchanged", "unchanged"]
    assert [x for _, x in made["b1"].stage_log] == ["pushed", "pushed"]
    assert res2.folder == res.folder and (res2.n_skipped, res2.n_not_run) == (9, 0)
    m2 = load_manifest(res.folder)
    assert {r.run_id: r.sha256 for r in m2.runs if r.run_id in before} == before  # nothing finished is lost
    assert [r.status for r in m2.runs if r.cell in (4, 5)].count("ok") == 3 and m2.status == "complete"
    assert raw_file_changes(res.folder, m2) == []


def test_device_back_within_the_grace_time_goes_on(lab, tmp_path):
    restore(lab)
    p = campaign(tmp_path, "back", ["a1", "a2"], grace=60)
    root = tmp_path / "bd"
    port, server = DEVS["a2"]

    def bounce():
        lab.kill_device(port)
        time.sleep(1.5)
        lab.start_device(port, server)

    killer = kill_when_running(root, "back", [2, 3], bounce)
    res, out = run(p, root)
    killer.join()
    m = load_manifest(res.folder)
    assert res.n_not_run == 0 and res.n_failed == 1
    (bad,) = [r for r in m.runs if r.status == "failed"]
    assert bad.device == "a2" and bad.reason.startswith("device gone")
    assert sum(r.status == "ok" and r.device == "a2" for r in m.runs) == 3  # its queue went on once it was back
    assert "a2: not answering" in out.file.getvalue()


def test_server_stopped_mid_campaign_its_share_goes_to_the_other_server(lab, tmp_path):
    restore(lab)
    p = campaign(tmp_path, "srv", list(DEVS), use="spread", repeats=8, grace=2)
    root = tmp_path / "bd"
    t0 = {}

    def stop():
        t0["t"] = time.time()
        lab.stop_server(S2)

    killer = kill_when_running(root, "srv", [0, 1], stop, after_s=0.6)
    try:
        res, out = run(p, root)
        killer.join()
    finally:
        restore(lab)
    m = load_manifest(res.folder)
    assert res.n_not_run == 0 and res.n_ok + res.n_failed == 16
    failed = [r for r in m.runs if r.status == "failed"]
    assert 1 <= len(failed) <= 2 and all(r.device in ("b1", "b2") and r.reason.startswith("device gone")
                                         for r in failed), [(r.device, r.reason) for r in failed]
    late = [r for r in m.runs if _t(r.start) > t0["t"] + 1]
    assert late and {r.device for r in late} <= {"a1", "a2"}
    text = out.file.getvalue()
    assert "b1: lost" in text and "b2: lost" in text and f"127.0.0.1:{S2}" in text


def test_server_unreachable_at_start_is_named_and_never_replaced(lab, tmp_path, monkeypatch):
    restore(lab)
    # adbutils, failing to reach a server, would run `adb start-server` here: at this port, from the environment
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(DOWN))
    gone = f'  - {{serial: "127.0.0.1:15599", server: "127.0.0.1:{DOWN}", label: x}}\n'
    p = campaign(tmp_path, "unr", ["a1"], grace=1, extra_targets=gone)
    try:
        res, out = run(p, tmp_path / "bd")
        assert not listening(DOWN), "a local adb server was started in place of the unreachable one"
    finally:
        subprocess.run([os.environ["BMOE_TEST_ADB"], "-P", str(DOWN), "kill-server"], capture_output=True,
                       timeout=20)
    text = out.file.getvalue()
    assert f"x: cannot be used now: adb is not usable: adb server 127.0.0.1:{DOWN} unreachable" in text
    assert (res.n_ok, res.n_not_run) == (4, 4)
    m = load_manifest(res.folder)
    assert "x" not in m.devices and all(r.status == "pending" for r in m.runs if r.cell >= 2)


def test_devices_command_lists_every_server_and_names_the_unreachable_one(lab, capsys):
    from harness.bench_cli import main

    restore(lab)
    rc = main(["devices", "--server", f"127.0.0.1:{S1}", "--server", f"127.0.0.1:{S2}",
               "--server", f"127.0.0.1:{DOWN}"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 1
    for port, server in DEVS.values():
        (line,) = [x for x in out if x.startswith(f"127.0.0.1:{port}@127.0.0.1:{server}\t")]
        cols = line.split("\t")
        assert cols[1] == "device" and cols[2] == "(no getprop)" and cols[4].startswith("RAM ")
        assert cols[5].startswith("Linux") and cols[6] == "(no fingerprint)"
    assert [x for x in out if "unreachable" in x] == [
        x for x in out if x.startswith(f"adb server 127.0.0.1:{DOWN} unreachable")]
    assert len([x for x in out if "unreachable" in x]) == 1 and not listening(DOWN)


def test_selector_takes_every_matching_device_of_its_servers(lab, tmp_path):
    restore(lab)
    p = campaign(tmp_path, "sel", [], use="spread", repeats=2)
    text = p.read_text().replace("fleet: {use: spread, device_grace_s: 20}\ntargets:\n",
                                 f"fleet: {{use: spread, servers: ['127.0.0.1:{S1}', '127.0.0.1:{S2}', "
                                 f"'127.0.0.1:{DOWN}'], match: {{min_ram_gib: 0.5}}}}\n")
    p.write_text(text)
    res, out = run(p, tmp_path / "bd")
    assert (res.n_ok, res.n_not_run) == (4, 0)
    m = load_manifest(res.folder)
    want = sorted(f"127.0.0.1:{port}@127.0.0.1:{server}" for port, server in DEVS.values())
    assert sorted(m.campaign.fleet.devices) == want and sorted(m.devices) == want
    assert m.campaign.fleet.servers == [f"127.0.0.1:{S1}", f"127.0.0.1:{S2}", f"127.0.0.1:{DOWN}"]
    assert f"adb server 127.0.0.1:{DOWN} unreachable" in out.file.getvalue()  # one line naming it
    p.write_text(text.replace("min_ram_gib: 0.5", "model: SM-S911B"))  # no Linux adbd has that model
    with pytest.raises(UserError, match="fleet.servers: no device to run on"):
        run(p, tmp_path / "bd")
